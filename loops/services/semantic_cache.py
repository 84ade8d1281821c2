"""The semantic cache's store (docs/semantic-cache.md): stored answers of a pattern's read-only
model calls, found again by an exact-match key and a cosine similarity at or over the pattern's
threshold.

Vectors are stored as unit-length little-endian float32, so a lookup is one matrix-vector
product (numpy) over the live entries of one (pattern, key). An expired entry is never returned;
a store deletes the pattern's expired entries.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import numpy.typing as npt
from django.db.models import F
from django.utils import timezone

from loops.cache_models import SemanticCacheEntry
from loops.models import LoopRun
from loops.policy import PatternPolicy
from orchestrator.agents.models import ModelEndpoint

_STORED = np.dtype("<f4")
#: The newest entries of one (pattern, key) a lookup compares (a bound on its cost).
SCAN_LIMIT = 500
_POINTER = "/policy/semanticCache"


@dataclass(frozen=True)
class CacheHit:
    """An entry near enough to the asked call: its id, similarity and stored response."""

    entry_id: int
    similarity: float
    response: dict[str, Any]


@dataclass(frozen=True)
class CacheTarget:
    """Where a run's cache lives and how it embeds: the pattern, the embedding endpoint."""

    pattern_id: int
    base_url: str
    api_key_env: str


def _err(pointer: str, detail: str, code: str) -> dict[str, str]:
    return {"pointer": f"{_POINTER}/{pointer}", "detail": detail, "code": code}


def semantic_cache_errors(policy: PatternPolicy) -> list[dict[str, str]]:
    """What an enabled cache lacks: an embedding model, an existing endpoint with a base URL."""
    cache = policy.semanticCache
    if not cache.enabled:
        return []
    errors = []
    if not cache.embeddingEndpoint:
        errors.append(_err("embeddingEndpoint", "required when the cache is enabled", "required"))
    else:
        base_url = (
            ModelEndpoint.objects.filter(name=cache.embeddingEndpoint)
            .values_list("base_url", flat=True)
            .first()
        )
        if base_url is None:
            detail = f"no model endpoint is named {cache.embeddingEndpoint!r}"
            errors.append(_err("embeddingEndpoint", detail, "not_found"))
        elif not base_url:
            detail = f"model endpoint {cache.embeddingEndpoint!r} has no base_url to embed with"
            errors.append(_err("embeddingEndpoint", detail, "invalid"))
    if not cache.embeddingModel.strip():
        errors.append(_err("embeddingModel", "required when the cache is enabled", "required"))
    return errors


def semantic_cache_target(*, run_id: uuid.UUID, endpoint: str) -> CacheTarget | None:
    """The run's pattern and the named embedding endpoint (None: either is gone)."""
    pattern_id = LoopRun.objects.filter(pk=run_id).values_list("pattern_id", flat=True).first()
    row = ModelEndpoint.objects.filter(name=endpoint).values("base_url", "api_key_env").first()
    if pattern_id is None or row is None or not row["base_url"]:
        return None
    return CacheTarget(pattern_id, str(row["base_url"]), str(row["api_key_env"]))


def pack(vector: Sequence[float]) -> bytes:
    """The stored form: the vector scaled to unit length, little-endian float32."""
    norm = math.sqrt(math.fsum(x * x for x in vector))
    unit = [x / norm for x in vector] if norm else [0.0 for _ in vector]
    return np.asarray(unit, dtype=_STORED).tobytes()


def _unpack(blob: bytes | memoryview) -> npt.NDArray[np.float32]:
    return np.frombuffer(bytes(blob), dtype=_STORED).astype(np.float32)


def semantic_cache_lookup(
    *,
    pattern_id: int,
    key: str,
    vector: Sequence[float],
    threshold: float,
    now: datetime | None = None,
) -> CacheHit | None:
    """The live entry of (pattern, key) most similar to ``vector`` when its cosine is at least
    ``threshold`` (ties: the newest), its hit counted; None otherwise."""
    now = now or timezone.now()
    rows = list(
        SemanticCacheEntry.objects.filter(pattern_id=pattern_id, key=key, expires_at__gt=now)
        .order_by("-id")
        .values_list("id", "embedding")[:SCAN_LIMIT]
    )
    query = np.frombuffer(pack(vector), dtype=_STORED).astype(np.float32)
    rows = [(entry_id, blob) for entry_id, blob in rows if len(blob) == len(query) * 4]
    if not rows:
        return None
    scores = np.stack([_unpack(blob) for _, blob in rows]) @ query
    best = int(np.argmax(scores))  # the first maximum: the newest entry
    similarity = float(scores[best])
    if similarity < threshold:
        return None
    entry_id = int(rows[best][0])
    counted = SemanticCacheEntry.objects.filter(pk=entry_id, expires_at__gt=now).update(
        hits=F("hits") + 1
    )
    response = SemanticCacheEntry.objects.filter(pk=entry_id).values_list("response", flat=True)
    stored = response.first() if counted else None
    if not isinstance(stored, dict):
        return None  # expired or pruned since it was read
    return CacheHit(entry_id, similarity, stored)


def semantic_cache_store(
    *,
    pattern_id: int,
    key: str,
    vector: Sequence[float],
    response: dict[str, Any],
    ttl_seconds: int,
    now: datetime | None = None,
) -> int:
    """Store an answer for ``ttl_seconds``; the pattern's expired entries are deleted."""
    now = now or timezone.now()
    semantic_cache_prune(pattern_id=pattern_id, now=now)
    entry = SemanticCacheEntry.objects.create(
        pattern_id=pattern_id,
        key=key,
        embedding=pack(vector),
        response=response,
        created_at=now,
        expires_at=now + timedelta(seconds=max(ttl_seconds, 1)),
    )
    return int(entry.pk)


def semantic_cache_prune(*, pattern_id: int | None = None, now: datetime | None = None) -> int:
    """Delete expired entries (of one pattern, or all); how many were deleted."""
    expired = SemanticCacheEntry.objects.filter(expires_at__lte=now or timezone.now())
    if pattern_id is not None:
        expired = expired.filter(pattern_id=pattern_id)
    deleted, _ = expired.delete()
    return deleted

"""Chunk vectors: stored as little-endian float32 of unit length, searched by an exact scan
(no vector index: pgvector is not installed on the servers this runs on).

For unit vectors the cosine is the dot product, so a search is one matrix-vector product
(numpy) and a partial sort. A process keeps each base's vectors as one float32 matrix per vector
length, keyed by the base's ``revision`` (bumped by every change to its chunks) and the
embedding model, so a search reads them from the database once per change: 4 bytes a
dimension (100,000 chunks of 768 dimensions: about 300 MB).
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from knowledge.models import KnowledgeBase, KnowledgeChunk

_STORED = np.dtype("<f4")


@dataclass(frozen=True)
class _Vectors:
    """One base's vectors of one length: chunk ids and the matching rows of a matrix."""

    ids: npt.NDArray[np.int64]
    matrix: npt.NDArray[np.float32]


_lock = threading.Lock()
#: base id → (revision, model stamp, {vector length: vectors})
_cache: dict[int, tuple[int, str, dict[int, _Vectors]]] = {}


def normalised(vector: Sequence[float]) -> list[float]:
    """``vector`` scaled to unit length (a zero vector stays zero)."""
    norm = math.sqrt(math.fsum(x * x for x in vector))
    return [x / norm for x in vector] if norm else [0.0 for _ in vector]


def pack(vector: Sequence[float]) -> bytes:
    """The stored form of a unit vector: little-endian float32."""
    return np.asarray(normalised(vector), dtype=_STORED).tobytes()


def unpack(blob: bytes | memoryview) -> npt.NDArray[np.float32]:
    return np.frombuffer(bytes(blob), dtype=_STORED).astype(np.float32)


def _load(base_id: int, stamp: str) -> dict[int, _Vectors]:
    revision = KnowledgeBase.objects.filter(pk=base_id).values_list("revision", flat=True).first()
    with _lock:
        cached = _cache.get(base_id)
    if cached is not None and cached[0] == revision and cached[1] == stamp:
        return cached[2]
    rows = KnowledgeChunk.objects.filter(
        base_id=base_id, embedded_model=stamp, embedding__isnull=False
    ).values_list("id", "embedding")
    ids: defaultdict[int, list[int]] = defaultdict(list)
    blobs: defaultdict[int, list[bytes]] = defaultdict(list)
    for chunk_id, blob in rows.iterator(chunk_size=2000):
        if not blob:
            continue
        data = bytes(blob)
        size = len(data) // _STORED.itemsize
        ids[size].append(chunk_id)
        blobs[size].append(data)
    found = {
        size: _Vectors(
            ids=np.asarray(ids[size], dtype=np.int64),
            matrix=np.frombuffer(b"".join(blobs[size]), dtype=_STORED)
            .astype(np.float32)
            .reshape(len(ids[size]), size),
        )
        for size in ids
    }
    with _lock:
        _cache[base_id] = (revision or 0, stamp, found)
    return found


def nearest(
    base_id: int, stamp: str, query: Sequence[float], limit: int
) -> list[tuple[int, float]]:
    """``(chunk id, cosine)`` of the ``limit`` chunks of the base nearest to ``query`` (the
    chunks embedded with ``stamp``), best first, ties by chunk id; vectors of another length
    are skipped."""
    vectors = _load(base_id, stamp).get(len(query))
    if vectors is None or limit <= 0:
        return []
    unit = np.asarray(normalised(query), dtype=np.float32)
    scores = vectors.matrix @ unit
    count = min(limit, len(scores))
    if count < len(scores):
        # Every chunk scoring at least the count-th best (ties at the cut included).
        cut = np.partition(scores, len(scores) - count)[len(scores) - count]
        picked = np.flatnonzero(scores >= cut)
    else:
        picked = np.arange(len(scores))
    order = np.lexsort((vectors.ids[picked], -scores[picked]))[:count]
    return [(int(vectors.ids[picked[i]]), float(scores[picked[i]])) for i in order]


def forget(base_id: int | None = None) -> None:
    """Drop the cached vectors of one base (or all)."""
    with _lock:
        if base_id is None:
            _cache.clear()
        else:
            _cache.pop(base_id, None)

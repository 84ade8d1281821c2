"""Vectors from an OpenAI-compatible embeddings endpoint (``POST {embedding_url}/embeddings``,
``{"model", "input": [...]}`` → ``data[i].embedding``), through the outbound guard, the key
read from the base's allowed environment variable at each call.

``e5-http`` bases prefix what they embed as E5 models expect: ``passage: `` for chunks,
``query: `` for questions. A wrong or malformed answer raises :class:`EmbeddingFailed`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import httpx2

from knowledge.http import guarded_client
from knowledge.models import KnowledgeBase, KnowledgeProvider
from runtime import outbound
from runtime.outbound import OutboundRefused, ResponseTooLarge
from runtime.secrets import SecretNotAllowed, api_key_from_env, current_secret_rule, redact

#: Texts per request.
BATCH = 64
TIMEOUT_SECONDS = 30.0


class EmbeddingFailed(Exception):
    """The endpoint could not be reached, refused, or answered something unusable."""


def embed_query(base: KnowledgeBase, query: str) -> list[float]:
    prefix = "query: " if base.provider == KnowledgeProvider.E5_HTTP else ""
    return embed_texts(base, [prefix + query])[0]


def embed_passages(base: KnowledgeBase, texts: Sequence[str]) -> list[list[float]]:
    """One vector per text, in order (requests of at most ``BATCH`` texts)."""
    prefix = "passage: " if base.provider == KnowledgeProvider.E5_HTTP else ""
    vectors: list[list[float]] = []
    for start in range(0, len(texts), BATCH):
        vectors += embed_texts(base, [prefix + text for text in texts[start : start + BATCH]])
    return vectors


def embed_texts(base: KnowledgeBase, texts: list[str]) -> list[list[float]]:
    """The vectors of ``texts`` as the endpoint gives them (one request)."""
    if not base.embeds:
        raise EmbeddingFailed(f'knowledge base "{base.key}" has no embedding endpoint')
    try:
        key = api_key_from_env(base.embedding_key_env, rule=current_secret_rule())
    except SecretNotAllowed as exc:
        raise EmbeddingFailed(str(exc)) from None
    if base.embedding_key_env and key is None:
        raise EmbeddingFailed(f"the environment variable {base.embedding_key_env} is not set")
    url = base.embedding_url.rstrip("/") + "/embeddings"
    headers = {"Authorization": f"Bearer {key.reveal()}"} if key is not None else {}
    try:
        policy, http = guarded_client()
        outbound.check_url(url, policy)
        response = http.post(
            url,
            json={"model": base.embedding_model, "input": texts},
            headers=headers,
            timeout=TIMEOUT_SECONDS,
        )
        response.raise_for_status()
        body = response.json()
    except (OutboundRefused, ResponseTooLarge, httpx2.HTTPError, ValueError) as exc:
        raise EmbeddingFailed(redact(f"{url}: {type(exc).__name__}: {exc}", key)[:500]) from None
    return _vectors(body, len(texts), base.embedding_dims)


def _vectors(body: Any, count: int, dims: int) -> list[list[float]]:
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or len(data) != count:
        raise EmbeddingFailed(f"the answer has no data list of {count} embeddings")
    ordered = sorted(data, key=lambda item: item.get("index", 0) if isinstance(item, dict) else 0)
    vectors: list[list[float]] = []
    for item in ordered:
        vector = item.get("embedding") if isinstance(item, dict) else None
        if not isinstance(vector, list) or not vector:
            raise EmbeddingFailed("an embedding is not a list of numbers")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in vector):
            raise EmbeddingFailed("an embedding is not a list of numbers")
        if not all(math.isfinite(x) for x in vector):
            raise EmbeddingFailed("an embedding has a value that is not finite")
        if dims and len(vector) != dims:
            raise EmbeddingFailed(f"an embedding has {len(vector)} dimensions, not {dims}")
        vectors.append([float(x) for x in vector])
    return vectors

"""Vectors from an OpenAI-compatible embeddings endpoint (``POST {base_url}/embeddings``,
``{"model", "input": [...]}`` → ``data[i].embedding``), through the outbound guard; no Django.

The key is read from the endpoint's allowed environment variable at each call. A wrong or
malformed answer, a refused address or a refused variable raises :class:`EmbeddingFailed`
(callers that may go on without a vector catch it).
"""

from __future__ import annotations

import math
from typing import Any

import httpx2

from runtime import outbound, outbound_http
from runtime.outbound import OutboundRefused, ResponseTooLarge
from runtime.secrets import SecretNotAllowed, api_key_from_env, current_secret_rule, redact

TIMEOUT_SECONDS = 30.0


class EmbeddingFailed(Exception):
    """The endpoint could not be reached, refused, or answered something unusable."""


def embed(base_url: str, model: str, texts: list[str], *, key_env: str = "") -> list[list[float]]:
    """One vector per text, in order (one request); raises :class:`EmbeddingFailed`."""
    try:
        key = api_key_from_env(key_env, rule=current_secret_rule())
    except SecretNotAllowed as exc:
        raise EmbeddingFailed(str(exc)) from None
    if key_env and key is None:
        raise EmbeddingFailed(f"the environment variable {key_env} is not set")
    url = base_url.rstrip("/") + "/embeddings"
    headers = {"Authorization": f"Bearer {key.reveal()}"} if key is not None else {}
    try:
        policy, http = outbound_http.shared_client(TIMEOUT_SECONDS)
        outbound.check_url(url, policy)
        response = http.post(
            url, json={"model": model, "input": texts}, headers=headers, timeout=TIMEOUT_SECONDS
        )
        response.raise_for_status()
        body = response.json()
    except (OutboundRefused, ResponseTooLarge, httpx2.HTTPError, ValueError) as exc:
        raise EmbeddingFailed(redact(f"{url}: {type(exc).__name__}: {exc}", key)[:500]) from None
    return vectors_of(body, len(texts))


def vectors_of(body: Any, count: int) -> list[list[float]]:
    """The ``count`` finite, non-empty vectors of an embeddings answer, by ``index``."""
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
        vectors.append([float(x) for x in vector])
    return vectors

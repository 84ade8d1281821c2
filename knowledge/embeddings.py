"""Vectors from an OpenAI-compatible embeddings endpoint (``POST {embedding_url}/embeddings``,
``{"model", "input": [...]}`` → ``data[i].embedding``), through the outbound guard, the key
read from the base's allowed environment variable at each call.

``e5-http`` bases prefix what they embed as E5 models expect: ``passage: `` for chunks,
``query: `` for questions. A wrong or malformed answer raises :class:`EmbeddingFailed`.
"""

from __future__ import annotations

from collections.abc import Sequence

from knowledge.models import KnowledgeBase, KnowledgeProvider
from runtime.embeddings import EmbeddingFailed, embed

__all__ = ["EmbeddingFailed", "embed_passages", "embed_query", "embed_texts"]

#: Texts per request.
BATCH = 64


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
    """The vectors of ``texts`` as the endpoint gives them (one request), each of the base's
    dimensions."""
    if not base.embeds:
        raise EmbeddingFailed(f'knowledge base "{base.key}" has no embedding endpoint')
    vectors = embed(base.embedding_url, base.embedding_model, texts, key_env=base.embedding_key_env)
    dims = base.embedding_dims
    for vector in vectors:
        if dims and len(vector) != dims:
            raise EmbeddingFailed(f"an embedding has {len(vector)} dimensions, not {dims}")
    return vectors

"""Knowledge base search and ingest, on PostgreSQL (docs/knowledge.md).

* **Full-text search.** ``knowledge_search`` over one base of ``CHUNKS`` chunks (about 800
  characters each, words drawn from a 5,000-word vocabulary with Zipf frequencies; queries are
  three words of rank 200 to 5,000), the Retrieval row included. Target: p50 <= 20 ms.
* **Hybrid search.** The same base with 64-dimension vectors: the query embedded by the loopback
  embedding server (``tests/support/embedding_server.py``, one HTTP request per search), the
  exact vector scan and the full-text list fused. The chunk vectors are made in-process with
  the server's own embedder (the same numbers, without 1,600 HTTP requests). Target: p50 <= 50 ms
  (after the first search, which loads the base's vectors).
* **Ingest.** ``document_put`` of one ``INGEST_MB`` MB Markdown document without embeddings
  (extract, chunk, store, index). Target: <= 30 s.

The database is ``lw_knowledge_bench`` (``LOOPWRIGHT_BENCH_KNOWLEDGE_DB``) on the server of
``DATABASE_URL``, created, migrated and dropped here. ``python -m bench.knowledge [--smoke]``
prints the rows.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from typing import Any

from bench.common import (
    _migrate,
    child_main,
    log_dir,
    percentile,
    pg_admin,
    pg_url,
    row,
    run_child,
    server_url,
)

DB_NAME = os.environ.get("LOOPWRIGHT_BENCH_KNOWLEDGE_DB", "lw_knowledge_bench")
CHUNKS, QUERIES, INGEST_MB = 100_000, 60, 10
TARGET_FULLTEXT_MS, TARGET_HYBRID_MS, TARGET_INGEST_S = 20.0, 50.0, 30.0
VOCABULARY = 5000
DIMS = 64
_SYLLABLES = [a + b for a in "bcdfghklmnprstvz" for b in ("a", "e", "i", "o", "u", "ay", "or")]


# --- the measuring child ---------------------------------------------------------------------


def _vocabulary(rng: random.Random) -> list[str]:
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < VOCABULARY:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def _chunk_text(rng: random.Random, words: list[str], weights: list[float]) -> str:
    sentences = []
    length = 0
    while length < 760:
        sentence = " ".join(rng.choices(words, weights, k=rng.randint(8, 16))).capitalize() + "."
        sentences.append(sentence)
        length += len(sentence) + 1
    return " ".join(sentences)


def _markdown(rng: random.Random, words: list[str], weights: list[float], size: int) -> str:
    parts: list[str] = []
    total = 0
    section = 0
    while total < size:
        if section % 5 == 0:
            heading = f"## {' '.join(rng.choices(words, weights, k=3)).title()}"
            parts.append(heading)
            total += len(heading) + 2
        paragraph = _chunk_text(rng, words, weights)[: rng.randint(200, 760)]
        parts.append(paragraph)
        total += len(paragraph) + 2
        section += 1
    return "\n\n".join(parts)


def _timed_searches(queries: list[str], key: str) -> list[float]:
    from knowledge.search import knowledge_search

    samples = []
    for query in queries:
        started = time.perf_counter()
        knowledge_search(employee="", query=query, bases=[key], top_k=5, user="bench")
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from django.db.models import F

    from knowledge import vectors
    from knowledge.models import KnowledgeBase, KnowledgeChunk, KnowledgeDocument
    from knowledge.services import document_put
    from knowledge.services_bases import base_create
    from tests.support.embedding_server import EmbeddingServer, bow_vector

    rng = random.Random(20250701)
    words = _vocabulary(rng)
    weights = [1.0 / rank for rank in range(1, VOCABULARY + 1)]
    result: dict[str, Any] = {"chunks": args.chunks, "ingest_mb": args.ingest_mb}

    markdown = _markdown(rng, words, weights, int(args.ingest_mb * 1024 * 1024)).encode()
    ingest = base_create(key="ingest", name="Ingest")
    started = time.perf_counter()
    stored = document_put(base=ingest, name="big.md", raw=markdown, content_type="text/markdown")
    result["ingest_s"] = time.perf_counter() - started
    result["ingest_chunks"] = stored.chunks
    result["ingest_bytes"] = len(markdown)

    contribution = {word: bow_vector(word, model="bow", dims=DIMS) for word in words}
    with EmbeddingServer(dims=DIMS) as server:
        base = base_create(
            key="bench", name="Bench", embedding_url=server.url, embedding_model="bow",
            embedding_dims=DIMS,
        )  # fmt: skip
        stamp = base.model_stamp
        started = time.perf_counter()
        per_document = 100
        for first in range(0, args.chunks, per_document * 50):
            documents = KnowledgeDocument.objects.bulk_create(
                [
                    KnowledgeDocument(base=base, name=f"doc-{n:06d}.md", sha256="0" * 64)
                    for n in range(first // per_document, first // per_document + 50)
                    if n * per_document < args.chunks
                ]
            )  # fmt: skip
            rows = []
            for document in documents:
                number = int(document.name[4:10])
                for seq in range(per_document):
                    if number * per_document + seq >= args.chunks:
                        break
                    text = _chunk_text(rng, words, weights)
                    vector = [0.0] * DIMS
                    for word in text.lower().replace(".", "").split():
                        for index, value in enumerate(contribution[word]):
                            vector[index] += value
                    rows.append(KnowledgeChunk(
                        document=document, base=base, seq=seq, text=text,
                        embedding=vectors.pack(vector), embedded_model=stamp,
                    ))  # fmt: skip
            KnowledgeChunk.objects.bulk_create(rows, batch_size=2000)
        KnowledgeBase.objects.filter(pk=base.pk).update(revision=F("revision") + 1)
        result["load_s"] = time.perf_counter() - started
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("ANALYZE knowledge_knowledgechunk")

        queries = [" ".join(rng.sample(words[200:], 3)) for _ in range(args.queries)]
        KnowledgeBase.objects.filter(pk=base.pk).update(embedding_url="")
        _timed_searches(queries[:5], "bench")
        result["fulltext_ms"] = _timed_searches(queries, "bench")
        KnowledgeBase.objects.filter(pk=base.pk).update(embedding_url=server.url)
        started = time.perf_counter()
        _timed_searches(queries[:1], "bench")
        result["vector_load_ms"] = (time.perf_counter() - started) * 1000
        _timed_searches(queries[1:5], "bench")
        result["hybrid_ms"] = _timed_searches(queries, "bench")
        from knowledge.models import Retrieval

        result["modes"] = sorted(set(Retrieval.objects.values_list("mode", flat=True)))
    return result


# --- the runner ------------------------------------------------------------------------------


def _database() -> tuple[str, str]:
    pg_admin(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
    pg_admin(f'CREATE DATABASE "{DB_NAME}"')
    var_dir = tempfile.mkdtemp(prefix="lw-bench-knowledge-")
    _migrate(pg_url(DB_NAME), var_dir)
    return pg_url(DB_NAME), var_dir


def run(smoke: bool = False) -> list[dict[str, Any]]:
    if not server_url().startswith(("postgres://", "postgresql://")):
        return [row("knowledge search", "PostgreSQL", passed=None, note="needs PostgreSQL")]
    chunks, queries, ingest_mb = (3000, 10, 0.5) if smoke else (CHUNKS, QUERIES, INGEST_MB)
    url, var_dir = _database()
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "LOOPWRIGHT_VAR_DIR": var_dir,
        "CELERY_BROKER_URL": "memory://",
        "DJANGO_SETTINGS_MODULE": "orchestrator.settings",
        "LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("REDIS_URL", None)
    args = ["--chunks", str(chunks), "--queries", str(queries), "--ingest-mb", str(ingest_mb)]
    try:
        found = run_child("bench.knowledge", env, args, 3600, log_dir("knowledge"))
    finally:
        pg_admin(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        shutil.rmtree(var_dir, ignore_errors=True)
    fulltext, hybrid = found["fulltext_ms"], found["hybrid_ms"]
    return [
        row(
            f"full-text search over {found['chunks']:,} chunks (p50)",
            f"p50 <= {TARGET_FULLTEXT_MS:g} ms",
            passed=percentile(fulltext, 50) <= TARGET_FULLTEXT_MS,
            median_ms=percentile(fulltext, 50),
            p95_ms=round(percentile(fulltext, 95), 2),
            samples=len(fulltext),
        ),
        row(
            f"hybrid search over {found['chunks']:,} chunks, {DIMS} dims, loopback embedder (p50)",
            f"p50 <= {TARGET_HYBRID_MS:g} ms",
            passed=percentile(hybrid, 50) <= TARGET_HYBRID_MS and "hybrid" in found["modes"],
            median_ms=percentile(hybrid, 50),
            p95_ms=round(percentile(hybrid, 95), 2),
            first_search_ms=round(found["vector_load_ms"], 1),
            samples=len(hybrid),
        ),
        row(
            f"ingest of {found['ingest_bytes'] / 1048576:.1f} MB of Markdown, no embeddings",
            f"<= {TARGET_INGEST_S:g} s",
            passed=found["ingest_s"] <= TARGET_INGEST_S,
            median=found["ingest_s"],
            unit="s",
            chunks=found["ingest_chunks"],
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.knowledge")
    sub = parser.add_subparsers(dest="mode")
    child = sub.add_parser("child")
    child.add_argument("--out", required=True)
    child.add_argument("--chunks", type=int, default=CHUNKS)
    child.add_argument("--queries", type=int, default=QUERIES)
    child.add_argument("--ingest-mb", type=float, default=INGEST_MB)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.mode == "child":
        child_main(measure, args)
        return
    for found in run(smoke=args.smoke):
        print(found)


if __name__ == "__main__":
    sys.exit(main())

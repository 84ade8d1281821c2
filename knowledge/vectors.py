"""Chunk vectors: stored as little-endian float32 of unit length, searched by an exact scan
(no vector index: pgvector is not used, numpy is not a dependency).

For unit vectors ``cos(a, b) = 1 - |a - b|^2 / 2``, so the scan ranks by ``math.dist`` (a loop
in C) and reports the cosine. A process keeps each base's decoded vectors, keyed by the base's
``revision`` (bumped by every change to its chunks), so a search reads them from the database
once per change: as tuples of floats (fastest, about 32 bytes a dimension) up to
``TUPLE_VALUES`` values per base, as float32 arrays (4 bytes a dimension, about half as fast)
beyond.
"""

from __future__ import annotations

import heapq
import math
import sys
import threading
from array import array
from collections.abc import Sequence
from itertools import repeat

from knowledge.models import KnowledgeBase, KnowledgeChunk

_LITTLE = sys.byteorder == "little"
_lock = threading.Lock()
#: base id → (revision, model stamp, chunk ids, vectors)
_cache: dict[int, tuple[int, str, list[int], list[Sequence[float]], frozenset[int]]] = {}
#: Most vector values a base keeps as tuples of floats (beyond: float32 arrays).
TUPLE_VALUES = 16_000_000


def normalised(vector: Sequence[float]) -> list[float]:
    """``vector`` scaled to unit length (a zero vector stays zero)."""
    norm = math.sqrt(math.fsum(x * x for x in vector))
    return [x / norm for x in vector] if norm else [0.0 for _ in vector]


def pack(vector: Sequence[float]) -> bytes:
    """The stored form of a unit vector: little-endian float32."""
    packed = array("f", normalised(vector))
    if not _LITTLE:
        packed.byteswap()
    return packed.tobytes()


def unpack(blob: bytes | memoryview) -> array[float]:
    vector = array("f")
    vector.frombytes(bytes(blob))
    if not _LITTLE:
        vector.byteswap()
    return vector


def _load(base_id: int, stamp: str) -> tuple[list[int], list[Sequence[float]], frozenset[int]]:
    revision = KnowledgeBase.objects.filter(pk=base_id).values_list("revision", flat=True).first()
    with _lock:
        cached = _cache.get(base_id)
    if cached is not None and cached[0] == revision and cached[1] == stamp:
        return cached[2], cached[3], cached[4]
    rows = KnowledgeChunk.objects.filter(
        base_id=base_id, embedded_model=stamp, embedding__isnull=False
    ).values_list("id", "embedding")
    ids: list[int] = []
    found: list[Sequence[float]] = []
    values = 0
    for chunk_id, blob in rows.iterator(chunk_size=2000):
        if blob is None:
            continue
        vector = unpack(blob)
        values += len(vector)
        ids.append(chunk_id)
        found.append(tuple(vector) if values <= TUPLE_VALUES else vector)
    lengths = frozenset(len(vector) for vector in found)
    with _lock:
        _cache[base_id] = (revision or 0, stamp, ids, found, lengths)
    return ids, found, lengths


def nearest(
    base_id: int, stamp: str, query: Sequence[float], limit: int
) -> list[tuple[int, float]]:
    """``(chunk id, cosine)`` of the ``limit`` chunks of the base nearest to ``query`` (the
    chunks embedded with ``stamp``), best first; vectors of another length are skipped."""
    ids, found, lengths = _load(base_id, stamp)
    unit = tuple(normalised(query))
    size = len(unit)
    if lengths - {size}:
        pairs = [(i, v) for i, v in zip(ids, found, strict=True) if len(v) == size]
        ids, found = [i for i, _ in pairs], [v for _, v in pairs]
    distances = map(math.dist, repeat(unit), found)
    best = heapq.nsmallest(limit, zip(distances, ids, strict=True))
    return [(chunk, 1.0 - distance * distance / 2.0) for distance, chunk in best]


def forget(base_id: int | None = None) -> None:
    """Drop the cached vectors of one base (or all)."""
    with _lock:
        if base_id is None:
            _cache.clear()
        else:
            _cache.pop(base_id, None)

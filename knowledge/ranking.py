"""Reciprocal-rank fusion of ranked result lists (pure): each list gives an item
``1 / (RRF_K + rank)``; the sums rank the fused list, ties broken by key (deterministic)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

#: The usual constant of reciprocal-rank fusion (Cormack et al., 2009).
RRF_K = 60


@dataclass(frozen=True)
class Ranked:
    """An item of one ranked list, best first: its key, its list's score, which list."""

    key: str
    score: float
    kind: str


@dataclass(frozen=True)
class Fused:
    """An item of the fused list: the fused score, the score of the first list that had it,
    and every list's score by kind."""

    key: str
    score: float
    native: float
    scores: dict[str, float] = field(default_factory=dict)


def fuse(lists: Sequence[Sequence[Ranked]], top_k: int) -> list[Fused]:
    """The ``top_k`` items of ``lists`` by reciprocal-rank fusion."""
    totals: dict[str, float] = {}
    native: dict[str, float] = {}
    scores: dict[str, dict[str, float]] = {}
    for ranked in lists:
        for rank, item in enumerate(ranked, start=1):
            totals[item.key] = totals.get(item.key, 0.0) + 1.0 / (RRF_K + rank)
            native.setdefault(item.key, item.score)
            scores.setdefault(item.key, {})[item.kind] = round(item.score, 6)
    order = sorted(totals, key=lambda key: (-totals[key], -native[key], key))
    return [Fused(key, totals[key], native[key], scores[key]) for key in order[:top_k]]

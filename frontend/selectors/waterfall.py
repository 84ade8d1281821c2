"""The run page's waterfall: a run's spans laid out as bars on a time axis, one lane per role
invocation (docs/observability.md). The layout is a pure function of the spans."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from frontend.selectors.runs import invocation_title
from loops.models import LoopRun
from loops.services.spans import run_spans
from loops.spans import Span

#: Leaf kinds: the calls the slow marks compare.
CALLS = frozenset({"model", "tool", "skill", "subagent", "mcp", "a2a", "retrieval"})
MIN_WIDTH = 0.4  # percent: an instant call stays visible and clickable


@dataclass(frozen=True, slots=True)
class Bar:
    span: Span
    depth: int
    left: float
    width: float
    duration_ms: int | None
    slow: bool

    @property
    def failed(self) -> bool:
        return self.span.status == "error"

    @property
    def running(self) -> bool:
        return self.span.ended_at is None


@dataclass
class Lane:
    title: str
    employee: str
    role: str
    bars: list[Bar] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Waterfall:
    origin: str
    trace_id: str
    total_ms: int
    lanes: list[Lane]


def run_waterfall(run: LoopRun, now: datetime) -> Waterfall:
    """The run's spans (live or stored) as the run page draws them."""
    found = run_spans(run)
    return waterfall(found.spans, run.role_bindings or {}, now, found.origin, found.trace_id)


def waterfall(
    spans: Sequence[Span], bindings: Mapping[str, Any], now: datetime, origin: str, trace_id: str
) -> Waterfall:
    """Lanes (the run, then each top-level invocation with what it did, in tree order) and
    bars placed in percent of the run's extent; open spans reach ``now``."""
    if not spans:
        return Waterfall(origin, trace_id, 0, [])
    start = min(s.started_at for s in spans)
    end = max([now if s.ended_at is None else s.ended_at for s in spans])
    total = max((end - start).total_seconds(), 1e-3)
    slow = _slowest(spans)
    lanes: list[Lane] = []
    for span, depth in _in_tree_order(spans):
        if depth <= 1:
            lanes.append(_lane(span, bindings))
        stop = now if span.ended_at is None else span.ended_at
        left = (span.started_at - start).total_seconds() / total * 100
        width = max((stop - span.started_at).total_seconds() / total * 100, MIN_WIDTH)
        ms = int((stop - span.started_at).total_seconds() * 1000)
        bar = Bar(
            span, depth, round(left, 3), round(min(width, 100 - left), 3), ms, span.span_id in slow
        )
        lanes[-1].bars.append(bar)
    return Waterfall(origin, trace_id, int(total * 1000), lanes)


def _lane(span: Span, bindings: Mapping[str, Any]) -> Lane:
    if span.kind == "run":
        return Lane("Run", "", "run")
    title, employee = invocation_title(span.invocation, bindings)
    return Lane(title, employee, span.role)


def _in_tree_order(spans: Sequence[Span]) -> list[tuple[Span, int]]:
    children: dict[str, list[Span]] = {}
    for span in sorted(spans, key=lambda s: (s.started_at, s.step_seq or 0)):
        children.setdefault(span.parent_span_id, []).append(span)
    out: list[tuple[Span, int]] = []

    def visit(parent: str, depth: int) -> None:
        for span in children.get(parent, []):
            out.append((span, depth))
            visit(span.span_id, depth + 1)

    visit("", 0)
    return out


def _slowest(spans: Sequence[Span]) -> set[str]:
    """The slowest tenth of the finished calls (at least the slowest one, of three or more)."""
    calls = [s for s in spans if s.kind in CALLS and s.ended_at is not None]
    if len(calls) < 3:
        return set()
    ranked = sorted(calls, key=_duration, reverse=True)
    return {s.span_id for s in ranked[: max(1, len(calls) // 10)]}


def _duration(span: Span) -> float:
    return ((span.ended_at or span.started_at) - span.started_at).total_seconds()

"""A run's span tree, built from what the run already wrote (pure: no Django, no database).

run → role invocation → model call / tool call (skill, sub-agent, MCP, A2A) → approval wait;
a sub-agent's invocation nests under the tool call that dispatched it. Every span comes from a
row written with the step that produced it (a step, an approval, an ``invocation.started``
event, the run), so building the tree costs the hot path nothing; docs/observability.md.
Span ids are derived from the trace id and the row, so a tree built twice is the same tree.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

SUB_MARK = "/sub:"
EFFECT_RANK = {"read": 0, "write": 1, "external": 2}
#: Settings of a snapshot compiled before spans existed: then nothing asked for them.
OFF = {
    "enabled": False,
    "tracingRetentionDays": 0,
    "captureInputs": False,
    "captureOutputs": False,
    "redact": [],
    "samplingRate": 1.0,
}
MASK = "***"
_STEP_STATUS = {"completed": "ok", "failed": "error", "started": "running", "approved": "running"}
_APPROVAL_STATUS = {"approved": "ok", "pending": "running"}
_RUN_STATUS = {"succeeded": "ok", "failed": "error", "canceled": "error"}


@dataclass(frozen=True, slots=True)
class Span:
    """One span of a run's tree; ``ended_at`` None while it is open."""

    span_id: str
    parent_span_id: str
    kind: str
    name: str
    role: str
    invocation: str
    status: str
    started_at: datetime
    ended_at: datetime | None
    error: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    model: str = ""
    endpoint: str = ""
    tier: str = ""
    step_seq: int | None = None
    retention_days: int = 0
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RunFacts:
    """The run row's part of the tree: ids, times, outcome and the per-role snapshots."""

    run_id: str
    trace_id: str
    name: str
    status: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    failure_reason: str
    harness_snapshots: Mapping[str, Any]
    role_bindings: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Observed:
    """A role's compiled ``observability`` section and its raised tool effects."""

    enabled: bool
    retention_days: int
    capture_inputs: bool
    capture_outputs: bool
    effects: Mapping[str, str]
    redact: tuple[re.Pattern[str], ...] = ()


def span_id_of(seed: str, key: str) -> str:
    """A 16-hex span id, stable for the same run and row (never all zeros)."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()[:16]
    return digest if int(digest, 16) else "0000000000000001"


def _seed_of(trace_id: str, run_id: str) -> str:
    # Runs started by one event share the caller's trace id; their span ids must differ.
    return f"{trace_id}:{run_id}"


def _seed(run: RunFacts) -> str:
    return _seed_of(run.trace_id, run.run_id)


def run_span_id(trace_id: str, run_id: str) -> str:
    """The span id of a run's root span (what its log lines name outside an invocation)."""
    return span_id_of(_seed_of(trace_id, run_id), "run")


def invocation_span_id(trace_id: str, run_id: str, invocation: str) -> str:
    """The span id of a role invocation's span (what its log lines name)."""
    return span_id_of(_seed_of(trace_id, run_id), f"invocation:{invocation}")


def observed(run: RunFacts, role: str, invocation: str) -> Observed:
    """The observability settings of the snapshot a role's invocation ran under."""
    snaps = run.harness_snapshots or {}
    if role == "maker":
        makers = list((run.role_bindings or {}).get("makers") or [])
        match = re.match(r"maker:(\d+)", invocation)
        index = int(match.group(1)) if match else 0
        employee = makers[index] if index < len(makers) else ""
        snap = ((snaps.get("makers") or {}).get(employee)) or {}
    else:
        snap = snaps.get(role) or {}
    settings = snap.get("settings") or {}
    section = {**OFF, **(settings.get("observability") or {})}
    return Observed(
        enabled=bool(section["enabled"]) and sampled(run.trace_id, section["samplingRate"]),
        retention_days=int(section["tracingRetentionDays"]),
        capture_inputs=bool(section["captureInputs"]),
        capture_outputs=bool(section["captureOutputs"]),
        effects=dict((settings.get("tools") or {}).get("effects") or {}),
        redact=_patterns(tuple(section["redact"])),
    )


def sampled(trace_id: str, rate: float) -> bool:
    """Is a trace in the sample of ``rate``? OpenTelemetry's ``TraceIdRatioBased`` rule (the
    trace id's low 64 bits under ``rate`` x 2^64), so one trace is in or out everywhere and a
    role with a lower rate is only ever in the sample when the higher ones are too."""
    if rate >= 1.0:
        return True
    try:
        low = int(trace_id, 16) & 0xFFFFFFFFFFFFFFFF
    except ValueError:
        return False
    return low < round(rate * 2**64)


@functools.lru_cache(maxsize=256)
def _patterns(texts: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(text) for text in texts)


def redacted(value: Any, patterns: Sequence[re.Pattern[str]]) -> Any:
    """``value`` (JSON data) with every match of ``patterns`` in its strings masked."""
    if not patterns:
        return value
    if isinstance(value, str):
        for pattern in patterns:
            value = pattern.sub(MASK, value)
        return value
    if isinstance(value, list):
        return [redacted(item, patterns) for item in value]
    if isinstance(value, dict):
        return {key: redacted(item, patterns) for key, item in value.items()}
    return value


def tool_kind(name: str) -> str:
    """The span kind of a tool call by its tool's name."""
    if name.startswith("mcp__"):
        return "mcp"
    if name.startswith("a2a__"):
        return "a2a"
    if name.startswith("skill_hub_"):
        return "skill"
    if name == "dispatch_sub_agent_task":
        return "subagent"
    if name in ("knowledge_search", "external_rag_search"):
        return "retrieval"
    return "tool"


def tier_of(step: Mapping[str, Any], rules: Observed) -> str:
    """The call's effect tier: its tool's declared effect raised by the snapshot's effects."""
    declared = str((step.get("request") or {}).get("effect") or "")
    raised = str(rules.effects.get(step["name"], ""))
    tiers = [t for t in (declared, raised) if t in EFFECT_RANK]
    return max(tiers, key=EFFECT_RANK.__getitem__) if tiers else ""


def _step_span(seed: str, step: Mapping[str, Any], parent: str, rules: Observed) -> Span:
    response = step.get("response")
    is_model = step["kind"] == "model"
    reply = response if isinstance(response, dict) else {}
    attributes: dict[str, Any] = {}
    if rules.capture_inputs:
        attributes["input"] = redacted(step.get("request"), rules.redact)
    if rules.capture_outputs:
        attributes["output"] = redacted(response, rules.redact)
    status = "error" if step.get("error") else _STEP_STATUS.get(step["status"], "running")
    return Span(
        span_id=span_id_of(seed, f"step:{step['seq']}"),
        parent_span_id=parent,
        kind="model" if is_model else tool_kind(step["name"]),
        name=step["name"] or step["kind"],
        role=step["role"],
        invocation=step["invocation"],
        status=status,
        started_at=_step_start(step),
        ended_at=step.get("finished_at"),
        error=step.get("error") or "",
        tokens_in=int(step.get("tokens_in") or 0),
        tokens_out=int(step.get("tokens_out") or 0),
        cost=float(step.get("cost") or 0),
        model=str(reply.get("model") or (step["name"] if is_model else "")),
        endpoint=str(reply.get("endpoint") or "") if is_model else "",
        tier="" if is_model else tier_of(step, rules),
        step_seq=int(step["seq"]),
        retention_days=rules.retention_days,
        attributes=attributes,
    )


def _step_start(step: Mapping[str, Any]) -> datetime:
    """A step's row is written when it ends (a model step) or before it runs (a call): its
    measured duration back from its end, when that is earlier than the row."""
    started, finished, ms = step["started_at"], step.get("finished_at"), step.get("duration_ms")
    if finished is None or ms is None:
        return started
    return min(started, finished - timedelta(milliseconds=int(ms)))


def _approval_span(seed: str, approval: Mapping[str, Any], parent: str, days: int) -> Span:
    status = approval["status"]
    return Span(
        span_id=span_id_of(seed, f"approval:{approval['id']}"),
        parent_span_id=parent,
        kind="approval",
        name=f"approval {approval['tool_name']}",
        role=approval["role"],
        invocation=approval["invocation"],
        status=_APPROVAL_STATUS.get(status, "error"),
        started_at=approval["created_at"],
        ended_at=approval.get("decided_at"),
        error="" if status in _APPROVAL_STATUS else status,
        step_seq=int(approval["step_seq"]),
        retention_days=days,
        attributes={"decision": status, "decided_by": approval.get("decided_by") or ""},
    )


@dataclass
class _Builder:
    run: RunFacts
    starts: Mapping[str, datetime]
    spans: list[Span] = field(default_factory=list)
    invocations: dict[str, str] = field(default_factory=dict)
    calls: dict[tuple[str, int, int], str] = field(default_factory=dict)

    def invocation_span(self, invocation: str, role: str, at: datetime, rules: Observed) -> str:
        known = self.invocations.get(invocation)
        if known is not None:
            return known
        parent = run_span_id(self.run.trace_id, self.run.run_id)
        if SUB_MARK in invocation:
            outer, task = invocation.rsplit(SUB_MARK, 1)
            seq, _, index = task.partition(".")
            parent = self.calls.get((outer, _int(seq), _int(index))) or self.invocation_span(
                outer, role, at, rules
            )
        span_id = invocation_span_id(self.run.trace_id, self.run.run_id, invocation)
        self.invocations[invocation] = span_id
        start = min(self.starts.get(invocation, at), at)
        self.spans.append(
            Span(
                span_id=span_id,
                parent_span_id=parent,
                kind="invocation",
                name=invocation,
                role=role,
                invocation=invocation,
                status="running",
                started_at=start,
                ended_at=None,
                retention_days=rules.retention_days,
            )
        )
        return span_id


def _int(text: str) -> int:
    return int(text) if text.isdigit() else -1


def build_spans(
    run: RunFacts,
    steps: Iterable[Mapping[str, Any]],
    approvals: Iterable[Mapping[str, Any]],
    invocation_starts: Mapping[str, datetime],
) -> list[Span]:
    """Every span of the run, parents before children; the roles whose snapshot has
    ``observability.enabled`` false are left out (and the run span when every role is).
    Inputs and outputs are kept only as the role's ``captureInputs``/``captureOutputs`` say."""
    builder = _Builder(run, invocation_starts)
    for step in sorted(steps, key=lambda s: s["seq"]):
        rules = observed(run, step["role"], step["invocation"])
        if not rules.enabled or step["kind"] == "notice":
            continue
        parent = builder.invocation_span(step["invocation"], step["role"], _step_start(step), rules)
        span = _step_span(_seed(run), step, parent, rules)
        builder.spans.append(span)
        request = step.get("request") or {}
        if step["kind"] == "tool" and isinstance(request, dict):
            call = (_int(str(request.get("model_seq"))), _int(str(request.get("index"))))
            builder.calls[(step["invocation"], *call)] = span.span_id
    by_seq = {s.step_seq: s for s in builder.spans if s.kind != "invocation"}
    for approval in approvals:
        rules = observed(run, approval["role"], approval["invocation"])
        if not rules.enabled:
            continue
        step_span = by_seq.get(int(approval["step_seq"]))
        parent = (
            step_span.span_id
            if step_span
            else builder.invocation_span(
                approval["invocation"], approval["role"], approval["created_at"], rules
            )
        )
        builder.spans.append(_approval_span(_seed(run), approval, parent, rules.retention_days))
    if not builder.spans:
        return []
    return _closed(run, builder.spans)


def _run_span(run: RunFacts, children: Sequence[Span], days: int) -> Span:
    model = [s for s in children if s.kind == "model"]
    start = min([run.started_at or run.created_at, *(s.started_at for s in children)])
    return Span(
        span_id=run_span_id(run.trace_id, run.run_id),
        parent_span_id="",
        kind="run",
        name=run.name,
        role="",
        invocation="",
        status=_RUN_STATUS.get(run.status, "running"),
        started_at=start,
        ended_at=run.finished_at,
        error=run.failure_reason if run.status in ("failed", "canceled") else "",
        tokens_in=sum(s.tokens_in for s in model),
        tokens_out=sum(s.tokens_out for s in model),
        cost=sum(s.cost for s in model),
        retention_days=days,
        attributes={"run_id": run.run_id, "status": run.status},
    )


def _closed(run: RunFacts, spans: list[Span]) -> list[Span]:
    """Invocation spans get their children's extent and sums; what is still open when the
    run has ended ends with the run."""
    children: dict[str, list[Span]] = {}
    for span in spans:
        children.setdefault(span.parent_span_id, []).append(span)
    ended = run.finished_at
    last = max(spans, key=lambda s: s.started_at).invocation
    done: dict[str, Span] = {}

    def close(span: Span) -> Span:
        if span.span_id in done:
            return done[span.span_id]
        raw = children.get(span.span_id, [])
        kids = [close(k) for k in raw]
        if span.kind == "invocation":
            unfinished = any(k.ended_at is None for k in raw) or _working(run, span, last)
            span = _invocation_closed(span, kids, ended, unfinished)
        elif span.ended_at is None and ended is not None:
            # Still open when its run ended: it never finished.
            span = replace(span, ended_at=max(ended, span.started_at), status="error")
        if kids and span.kind not in ("invocation", "model"):  # a sub-agent's usage
            span = replace(span, **_usage(span, kids))
        done[span.span_id] = span
        return span

    closed = [close(s) for s in spans]
    days = max(s.retention_days for s in closed)
    return [_run_span(run, closed, days), *closed]


def _working(run: RunFacts, span: Span, last: str) -> bool:
    """Is this the invocation (or a parent of the one) the running run is in right now?"""
    inside = last == span.invocation or last.startswith(span.invocation + SUB_MARK)
    return inside and run.status in ("running", "verifying")


def _invocation_closed(
    span: Span, kids: Sequence[Span], ended: datetime | None, still_open: bool
) -> Span:
    own = [k for k in kids if k.kind != "approval"]
    ends = [k.ended_at for k in kids if k.ended_at is not None]
    end = None if still_open and ended is None else max([*ends, span.started_at])
    if ended is not None and still_open:
        end = max(ended, span.started_at)
    # A failed call the model went on from is its own span's failure, not the invocation's;
    # an invocation still open when its run ended never finished.
    status = "running" if end is None else ("error" if still_open else "ok")
    return replace(span, ended_at=end, status=status, **_usage(span, own))


def _usage(span: Span, kids: Sequence[Span]) -> dict[str, Any]:
    """The span's own tokens and cost plus its children's (an invocation has none of its own)."""
    return {
        "tokens_in": span.tokens_in + sum(k.tokens_in for k in kids),
        "tokens_out": span.tokens_out + sum(k.tokens_out for k in kids),
        "cost": span.cost + sum(k.cost for k in kids),
    }


def span_tree(spans: Sequence[Span]) -> list[dict[str, Any]]:
    """The spans as nested dicts (``children``), roots first, children by start time."""
    nodes = {s.span_id: {**span_dict(s), "children": []} for s in spans}
    roots: list[dict[str, Any]] = []
    for span in sorted(spans, key=lambda s: (s.started_at, s.step_seq or 0)):
        node = nodes[span.span_id]
        parent = nodes.get(span.parent_span_id)
        (parent["children"] if parent is not None else roots).append(node)
    return roots


def span_dict(span: Span) -> dict[str, Any]:
    """A span as the API shows it (``retention_days`` stays internal)."""
    out = {name: getattr(span, name) for name in Span.__slots__ if name != "retention_days"}
    out["duration_ms"] = _ms(span.ended_at - span.started_at) if span.ended_at else None
    return out


def _ms(delta: timedelta) -> int:
    return max(0, int(delta.total_seconds() * 1000))

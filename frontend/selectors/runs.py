"""Read-only queries of the monitor and a run's page, and of their live streams."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import (
    CharField,
    Count,
    DecimalField,
    F,
    IntegerField,
    OuterRef,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce, Concat, Substr
from django.http import Http404
from django.utils import timezone

from frontend.selectors.budgets import attach_row_budgets
from loops.models import (
    ActionApproval,
    ApprovalStatus,
    LoopArtifact,
    LoopEvent,
    LoopRun,
    LoopStep,
    RunStatus,
    StepKind,
    TriggerType,
)

#: Heavy JSON columns a runs table never shows.
_LIST_DEFER = ("harness_snapshots", "policy_snapshot", "cursor", "result", "inputs", "goal")
TRIGGER_CHOICES = [*TriggerType.values, "retry"]
WAITING = (RunStatus.WAITING_APPROVAL, RunStatus.WAITING_HUMAN)
#: Runs a worker is driving now; a run parked on a human or a lock is not in flight.
IN_FLIGHT = (RunStatus.PREPARING, RunStatus.RUNNING, RunStatus.VERIFYING)
#: Between the fields of ``runs_for_table``'s ``latest_step`` (the ASCII unit separator).
STEP_FIELD_SEPARATOR = "\x1f"
#: How much of a run's goal a runs table reads (the column can be long).
GOAL_HEAD_CHARS = 160


def parse_run_id(value: str) -> uuid.UUID:
    """The run id in a URL, or a 404 (never a 500 for a malformed id)."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise Http404(f"{value!r} is not a run id.") from None


def _step_sum(column: str, output: IntegerField | DecimalField) -> Subquery:
    totals = (
        LoopStep.objects.filter(run=OuterRef("pk"))
        .order_by()
        .values("run")
        .annotate(total=Sum(column))
        .values("total")
    )
    return Subquery(totals, output_field=output)


def runs_for_table() -> QuerySet[LoopRun]:
    """Runs with their pattern, usage totals, the start of their goal and their latest step
    (per-run subqueries, no GROUP BY on runs)."""
    return (
        LoopRun.objects.select_related("pattern")
        .defer(*_LIST_DEFER)
        .annotate(
            tokens_in_total=_step_sum("tokens_in", IntegerField()),
            tokens_out_total=_step_sum("tokens_out", IntegerField()),
            cost_total=_step_sum("cost", DecimalField(max_digits=20, decimal_places=6)),
            pending_approvals=_pending_approvals(),
            per_run_budget=F("policy_snapshot__budgets__perRun"),
            goal_head=Substr("goal", 1, GOAL_HEAD_CHARS),
            latest_step=_latest_step(),
        )
    )


def _latest_step() -> Subquery:
    """The run's latest step as ``invocation<US>kind<US>name`` (:data:`STEP_FIELD_SEPARATOR`):
    one subquery on the (run, seq) key, no GROUP BY."""
    label = Concat(
        "invocation", Value(STEP_FIELD_SEPARATOR), "kind", Value(STEP_FIELD_SEPARATOR), "name",
        output_field=CharField(),
    )  # fmt: skip
    last = LoopStep.objects.filter(run=OuterRef("pk")).order_by("-seq").annotate(label=label)
    return Subquery(last.values("label")[:1], output_field=CharField())


def _pending_approvals() -> Coalesce:
    """How many approvals of the run wait for a decision (a subquery, no GROUP BY on runs)."""
    pending = (
        ActionApproval.objects.filter(run=OuterRef("pk"), status=ApprovalStatus.PENDING)
        .order_by()
        .values("run")
        .annotate(n=Count("id"))
        .values("n")
    )
    return Coalesce(Subquery(pending, output_field=IntegerField()), 0)


def with_budgets(runs: list[LoopRun]) -> list[LoopRun]:
    """The runs with ``run.budget`` set (their per-run tokens and cost limits and usage, one
    query for all of them; see :mod:`frontend.selectors.budgets`)."""
    attach_row_budgets(runs)
    return runs


def runs_by_ids(run_ids: Iterable[uuid.UUID]) -> list[LoopRun]:
    runs = runs_for_table().filter(pk__in=list(run_ids)).order_by("created_at", "id")
    return with_budgets(list(runs))


@dataclass(frozen=True)
class RunCounts:
    waiting_approval: int = 0
    waiting_human: int = 0
    in_flight: int = 0
    waiting_lock: int = 0
    queued: int = 0

    @property
    def waiting(self) -> int:
        return self.waiting_approval + self.waiting_human


def run_counts() -> RunCounts:
    """How many runs wait for a human, are in flight, wait for a lock or are queued (one
    grouped query); each run is counted once, by its status."""
    rows = (
        LoopRun.objects.filter(
            status__in=[*WAITING, *IN_FLIGHT, RunStatus.WAITING_LOCK, RunStatus.QUEUED]
        )
        .order_by()
        .values("status")
        .annotate(n=Count("id"))
    )
    by_status = {row["status"]: row["n"] for row in rows}
    return RunCounts(
        waiting_approval=by_status.get(RunStatus.WAITING_APPROVAL, 0),
        waiting_human=by_status.get(RunStatus.WAITING_HUMAN, 0),
        in_flight=sum(by_status.get(s, 0) for s in IN_FLIGHT),
        waiting_lock=by_status.get(RunStatus.WAITING_LOCK, 0),
        queued=by_status.get(RunStatus.QUEUED, 0),
    )


@dataclass(frozen=True)
class ChangeCursor:
    """Where a runs stream is: the highest event id and step id it has looked at."""

    event_id: int = 0
    step_id: int = 0

    def encode(self) -> str:
        return f"e{self.event_id}.s{self.step_id}"

    @classmethod
    def decode(cls, value: str) -> ChangeCursor | None:
        try:
            events, steps = value.split(".", 1)
            if not (events.startswith("e") and steps.startswith("s")):
                return None
            return cls(int(events[1:]), int(steps[1:]))
        except ValueError:
            return None


def change_cursor_now() -> ChangeCursor:
    last_event = LoopEvent.objects.order_by("-id").values_list("id", flat=True).first()
    last_step = LoopStep.objects.order_by("-id").values_list("id", flat=True).first()
    return ChangeCursor(last_event or 0, last_step or 0)


def rows_after(
    model: type[LoopEvent] | type[LoopStep], after_id: int, limit: int
) -> list[tuple[int, uuid.UUID, datetime]]:
    """(id, run id, written at) of events or steps with an id above ``after_id``, by key."""
    written = "created_at" if model is LoopEvent else "started_at"
    rows = model.objects.filter(id__gt=after_id).order_by("id").values_list("id", "run_id", written)
    return list(rows[:limit])


def run_detail(run_id: uuid.UUID) -> LoopRun:
    run = LoopRun.objects.select_related("pattern", "retry_of").filter(pk=run_id).first()
    if run is None:
        raise Http404(f"There is no run {run_id}.")
    return run


def run_state(run_id: uuid.UUID) -> dict[str, Any] | None:
    """The few columns that tell a run page whether to re-render its header."""
    found = (
        LoopRun.objects.filter(pk=run_id)
        .values("status", "updated_at", "event_seq", "step_count")
        .first()
    )
    return dict(found) if found is not None else None


@dataclass(frozen=True)
class RunUsage:
    tokens_in: int = 0
    tokens_out: int = 0
    cost: Decimal = Decimal(0)
    model_steps: int = 0
    tool_steps: int = 0
    model_ms: int = 0  # the steps' own durations, by kind
    tool_ms: int = 0


def run_usage(run_id: uuid.UUID) -> RunUsage:
    steps = LoopStep.objects.filter(run_id=run_id).order_by()
    totals = steps.aggregate(
        tokens_in=Coalesce(Sum("tokens_in"), 0),
        tokens_out=Coalesce(Sum("tokens_out"), 0),
        cost=Coalesce(Sum("cost"), Decimal(0), output_field=DecimalField()),
    )
    kinds = {
        kind: (n, int(ms or 0))
        for kind, n, ms in steps.values("kind")
        .annotate(n=Count("id"), ms=Sum("duration_ms"))
        .values_list("kind", "n", "ms")
    }
    model, tool = kinds.get(StepKind.MODEL, (0, 0)), kinds.get(StepKind.TOOL, (0, 0))
    return RunUsage(
        tokens_in=int(totals["tokens_in"]),
        tokens_out=int(totals["tokens_out"]),
        cost=Decimal(totals["cost"]),
        model_steps=model[0],
        tool_steps=tool[0],
        model_ms=model[1],
        tool_ms=tool[1],
    )


def run_retries(run_id: uuid.UUID) -> list[LoopRun]:
    return list(LoopRun.objects.filter(retry_of_id=run_id).only("id", "status").order_by("id"))


OPEN_STEP_STATUSES = ("started", "gated", "approved")


def run_steps(
    run_id: uuid.UUID, *, after_seq: int | None = None, seqs: Iterable[int] = ()
) -> list[LoopStep]:
    """Steps in seq order: all, or those after ``after_seq`` plus the listed ``seqs``; each
    with ``approval_wait_ms``, the part of its time it waited for a human (None: it did not)."""
    steps = LoopStep.objects.filter(run_id=run_id)
    if after_seq is not None:
        wanted = list(seqs)
        steps = steps.filter(seq__gt=after_seq) | steps.filter(seq__in=wanted)
    listed = list(steps.order_by("seq"))
    waits = approval_waits(run_id, [s.seq for s in listed if s.kind == StepKind.TOOL])
    for step in listed:
        step.approval_wait_ms = waits.get(step.seq)  # type: ignore[attr-defined]
    return listed


def approval_waits(run_id: uuid.UUID, seqs: Iterable[int] | None = None) -> dict[int, int]:
    """How long each gated step (of ``seqs``, or all) waited for its decision, in ms (until
    now while it waits)."""
    rows = ActionApproval.objects.filter(run_id=run_id)
    if seqs is not None:
        wanted = list(seqs)
        if not wanted:
            return {}
        rows = rows.filter(step_seq__in=wanted)
    now = timezone.now()
    return {
        seq: max(int(((decided or now) - asked).total_seconds() * 1000), 0)
        for seq, asked, decided in rows.values_list("step_seq", "created_at", "decided_at")
    }


@dataclass(frozen=True)
class TimeSplit:
    """Where a run's time went: model calls, tools running, and tools waiting for a human."""

    model_ms: int = 0
    tool_ms: int = 0
    approval_wait_ms: int = 0


def run_time_split(run_id: uuid.UUID, usage: RunUsage) -> TimeSplit:
    """The run's step time by kind (``usage``, from :func:`run_usage`), each gated tool step's
    approval wait taken out of its tool time."""
    waits = approval_waits(run_id)
    ran = dict(
        LoopStep.objects.filter(run_id=run_id, seq__in=list(waits)).values_list(
            "seq", "duration_ms"
        )
    )
    waited = taken_out = 0
    for seq, wait in waits.items():
        spent = ran.get(seq)
        part = min(wait, spent) if spent is not None else wait
        waited += part
        taken_out += part if spent is not None else 0
    return TimeSplit(usage.model_ms, max(usage.tool_ms - taken_out, 0), waited)


@dataclass
class InvocationGroup:
    """The steps of one role invocation (``leader``, ``maker:0``, ``verifier``)."""

    invocation: str
    role: str
    title: str
    employee: str
    steps: list[LoopStep] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        return "inv-" + self.invocation.replace(":", "-")


def invocation_title(invocation: str, bindings: Mapping[str, Any]) -> tuple[str, str]:
    """("Maker 1", "alice") for ``maker:0``: a heading and the employee who acted."""
    role, _, index = invocation.partition(":")
    if role == "maker" and index.isdigit():
        makers = list(bindings.get("makers") or [])
        number = int(index)
        employee = makers[number] if number < len(makers) else ""
        return f"Maker {number + 1}", employee
    return role.capitalize() or invocation, str(bindings.get(role) or "")


def invocation_group(invocation: str, role: str, bindings: Mapping[str, Any]) -> InvocationGroup:
    title, employee = invocation_title(invocation, bindings)
    return InvocationGroup(invocation=invocation, role=role, title=title, employee=employee)


def group_steps(steps: Iterable[LoopStep], bindings: Mapping[str, Any]) -> list[InvocationGroup]:
    """Steps grouped by invocation, groups in the order they first acted."""
    groups: dict[str, InvocationGroup] = {}
    for step in steps:
        group = groups.get(step.invocation)
        if group is None:
            group = groups[step.invocation] = invocation_group(step.invocation, step.role, bindings)
        group.steps.append(step)
    return list(groups.values())


def run_events(run_id: uuid.UUID, *, after_seq: int = 0) -> list[LoopEvent]:
    return list(LoopEvent.objects.filter(run_id=run_id, seq__gt=after_seq).order_by("seq"))


def run_artifacts(run_id: uuid.UUID) -> list[LoopArtifact]:
    """The run's artifacts, oldest first (diffs, reports), for the run page."""
    return list(LoopArtifact.objects.filter(run_id=run_id).order_by("created_at", "id"))

"""Fenced, durable step writes: each is one transaction that first proves the lease is held.

The engine's journal goes through :func:`tool_step_begin` for tool calls and
:func:`step_record` for finished steps; in the same transaction they apply the run's limits
(budgets: ``loops.services.budgets``; the tool-loop policy: ``loops.services.tool_repeats``), so a
crash never leaves a step without its count or a count without its step.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, NoReturn

from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from loops import db
from loops.models import LoopEvent, LoopRun, LoopStep, StepKind, StepStatus
from loops.policy import ToolLoopPolicy
from loops.services import budgets, step_sql, tool_repeats
from loops.services.transitions import Lease, fence_touch_sql, fenced_touch
from runtime.invocation import LeaseLost, StepRecord


def _cost(value: float) -> Decimal:
    return Decimal(str(round(value, 6)))


def _insert_step(lease: Lease, **values: Any) -> datetime:
    """INSERT one step row of the fenced run, its seq the run's current ``step_count`` (the
    caller's fence just raised it); returns its ``started_at``."""
    row = step_sql.step_row(**values)
    db.execute(*step_sql.insert_step(lease, row))
    started: datetime = row["started_at"]
    return started


def _occurrence(lease: Lease, digest: str) -> int:
    """:func:`tool_repeats.occurrence` in one plain statement (earlier tool steps of the run with
    the same call hash, + 1)."""
    rows = db.fetch_all(*step_sql.occurrences(lease, digest))
    return int(rows[0][0]) + 1


def _touch(
    lease: Lease, *, step_increment: int = 0, release_admission: bool = False
) -> tuple[int, budgets.RunLimits]:
    """The fence and the run's limits in one statement (:func:`budgets.fenced_limits`)."""
    seq, _, limits = budgets.fenced_limits(
        lease, step_increment=step_increment, release_admission=release_admission
    )
    return seq, limits


@transaction.atomic
def step_begin(
    lease: Lease,
    *,
    role: str,
    invocation: str,
    kind: str,
    name: str,
    request: dict[str, Any],
    idempotency_key: str = "",
    status: StepStatus = StepStatus.STARTED,
) -> int:
    """Persist a step before its effect happens (or a gated call); returns its seq.

    No limits are applied here: the engine's journal begins tool calls with
    :func:`tool_step_begin`."""
    seq, _ = fenced_touch(lease, step_increment=1)
    LoopStep.objects.create(
        run_id=lease.run_id,
        seq=seq,
        role=role,
        invocation=invocation,
        kind=kind,
        status=status,
        name=name,
        idempotency_key=idempotency_key,
        request=request,
        lease_token=lease.token,
        call_hash=_hash_of(kind, name, request),
    )
    return seq


def _hash_of(kind: str, name: str, request: Any) -> str | None:
    if kind != StepKind.TOOL:
        return None
    return tool_repeats.call_hash(
        name, tool_repeats.arguments_of(request if isinstance(request, dict) else {})
    )


@dataclass(frozen=True)
class ToolStart:
    """What :func:`tool_step_begin` made of a call: its step, and either the result the model
    gets instead of running it (``refused``) or a notice for its result."""

    seq: int
    refused: str = ""
    notice: str = ""
    #: When the step began (its ``started_at``), for :func:`step_complete`'s one-statement path.
    started_at: datetime | None = None
    #: The run's rule for reads as of this write (None from the exact path).
    rule: ReadRule | None = None


class _NotHeld(Exception):
    """A batch's fence matched no row (nothing was written); rolled back, then explained."""


class _NotPlain(Exception):
    """A batched write met a case it does not handle (a limit to judge, a tool-loop verdict,
    an approved call): its transaction is rolled back and the exact path runs instead."""


def _plain(
    limits: budgets.RunLimits, amounts: dict[str, int], verdict: tool_repeats.RepeatVerdict
) -> bool:
    """Nothing to judge: no counted limit on these amounts, no metered limit (whose room a
    tool call must check), an ordinary call for the tool-loop policy."""
    bounded = {*limits.per_run, *limits.daily}
    return (
        verdict is tool_repeats.RepeatVerdict.OK
        and not bounded.intersection(amounts)
        and not budgets.metered(limits)
    )


@dataclass(frozen=True)
class ReadRule:
    """What the lease holder's journal needs to let a read-effect call run before anything
    of it is persisted (:func:`tool_step_record` after it), as of its latest write: the call's
    occurrence the tool-loop policy warns from, and whether a limit must judge every tool call
    before it runs (a tool-call budget, a metered one)."""

    warn_at: int
    judged: bool
    #: The limits the rule was made from (for :func:`tool_step_record`'s one-round-trip write).
    limits: budgets.RunLimits | None = field(default=None, compare=False)

    def runs_first(self, name: str, occurrence: int) -> bool:
        return (
            not self.judged and name not in budgets.DELEGATION_TOOLS and occurrence < self.warn_at
        )


#: The counted metrics a tool call takes (:func:`budgets.tool_call_amounts`).
_TOOL_METRICS = frozenset({"toolCalls", "delegations"})


def read_rule(limits: budgets.RunLimits) -> ReadRule:
    counted = _TOOL_METRICS.intersection({*limits.per_run, *limits.daily})
    return ReadRule(
        warn_at=limits.tool_loop.warnAt,
        judged=bool(counted) or budgets.metered(limits),
        limits=limits,
    )


def invocation_begin(
    lease: Lease,
    *,
    role: str,
    invocation: str,
    expected: budgets.RunLimits | None = None,
) -> tuple[budgets.InvocationStart, dict[str, int]]:
    """:func:`budgets.budget_invocation_begin`, and the run's tool calls so far by hash (the
    journal's :meth:`runs_first` needs them).

    On PostgreSQL, when ``expected`` (the run's limits as the caller last read them) lets the
    invocation start without a judgement: one statement, one round trip, that proves those
    limits unchanged (:func:`_invocation_begin_unchanged`). Otherwise, or when they changed,
    one transaction of two round trips: whether the invocation already started, the fence
    with the run's limits and the calls; then, for a fresh invocation nothing limits, its
    ``invocation.started`` event, its counts and the commit. Anything else goes through the
    exact path."""
    if db.batches_are_sent_together():
        try:
            unchanged = _invocation_begin_unchanged(lease, role, invocation, expected)
            return unchanged or _invocation_begin_batched(lease, role, invocation)
        except _NotPlain:
            pass
    start = budgets.budget_invocation_begin(lease, role=role, invocation=invocation)
    return start, call_counts(lease.run_id)


def _start_amounts(role: str) -> dict[str, int]:
    return {"invocations": 1, **({"verifications": 1} if role == "verifier" else {})}


def _starts_plainly(limits: budgets.RunLimits, role: str) -> bool:
    """No metered limit and no counted limit on what a start of ``role`` counts."""
    bounded = {*limits.per_run, *limits.daily}
    return not budgets.metered(limits) and not bounded.intersection(_start_amounts(role))


def _invocation_begin_unchanged(
    lease: Lease, role: str, invocation: str, expected: budgets.RunLimits | None
) -> tuple[budgets.InvocationStart, dict[str, int]] | None:
    """The start in one statement (``step_sql.invocation_start_unchanged``) when ``expected``
    says it is plain; a resumed invocation (already started) is answered by the same
    statement. None when it does not apply or the limits changed (nothing was written)."""
    if expected is None or expected.fingerprint is None or not _starts_plainly(expected, role):
        return None
    usage = {metric: budgets.amount(n) for metric, n in _start_amounts(role).items()}
    statement = step_sql.invocation_start_unchanged(
        lease, expected.fingerprint, invocation=invocation, role=role, amounts=usage, day=_day()
    )
    with db.batch() as batch:
        found = batch.add(*statement)
    if not found.rows:
        raise LeaseLost(f"lease on run {lease.run_id} is no longer held by {lease.owner}")
    event_seq, started, steps, pattern_id, snapshot, pattern_policy, calls = found.rows[0]
    limits = budgets.limits_from_row(lease.run_id, pattern_id, snapshot, pattern_policy)
    pairs = json.loads(calls) if isinstance(calls, str) else calls  # jsonb comes as its text
    counts = {str(digest): int(n) for digest, n in pairs or []}
    if event_seq is not None:
        return budgets.InvocationStart(True, False, int(steps), limits), counts
    if started:
        resumed = budgets.InvocationStart(False, budgets.metered(limits), int(steps), limits)
        return resumed, counts
    return None


_STARTED_SQL = (
    "SELECT EXISTS (SELECT 1 FROM loops_loopevent WHERE run_id = %s "
    "AND type = 'invocation.started' AND data->>'invocation' = %s)"
)
_CALLS_SQL = (
    "SELECT call_hash, COUNT(*) FROM loops_loopstep WHERE run_id = %s AND kind = 'tool' "
    "AND call_hash IS NOT NULL GROUP BY call_hash"
)


def _invocation_begin_batched(
    lease: Lease, role: str, invocation: str
) -> tuple[budgets.InvocationStart, dict[str, int]]:
    with db.batch() as batch:
        started = batch.add(_STARTED_SQL, [lease.run_id, invocation])
        fence = batch.add(*budgets.fence_limits_sql(lease))
        calls = batch.add(_CALLS_SQL, [lease.run_id])
        batch.sync()
        steps, _, limits = budgets.limits_from_fence(lease, fence.rows)  # none: LeaseLost
        counts = {str(digest): int(n) for digest, n in calls.rows}
        if started.rows[0][0]:
            resumed = budgets.InvocationStart(False, budgets.metered(limits), steps, limits)
            return resumed, counts
        amounts = _start_amounts(role)
        if not _starts_plainly(limits, role):
            raise _NotPlain
        batch.add(*fence_touch_sql(lease, event_increment=1))
        data = {"invocation": invocation, "role": role}
        batch.add(*step_sql.insert_event(lease, budgets.INVOCATION_STARTED, data))
        usage = {metric: budgets.amount(n) for metric, n in amounts.items()}
        batch.add(*step_sql.usage_add(lease, usage, _day()))
    return budgets.InvocationStart(True, False, steps, limits), counts


def call_counts(run_id: uuid.UUID) -> dict[str, int]:
    """How often each tool call (name and arguments, hashed) was made in the run so far."""
    rows = (
        LoopStep.objects.filter(run_id=run_id, kind=StepKind.TOOL, call_hash__isnull=False)
        .values_list("call_hash")
        .annotate(n=Count("id"))
    )
    return {str(digest): int(n) for digest, n in rows}


def tool_step_begin(
    lease: Lease,
    *,
    role: str,
    invocation: str,
    name: str,
    request: dict[str, Any],
    idempotency_key: str = "",
    status: StepStatus = StepStatus.STARTED,
    model_step: ModelStep | None = None,
    expected: ReadRule | None = None,
) -> ToolStart:
    """Persist a tool call about to run (or gated), under the run's limits.

    In order: the tool-loop policy (escalate raises ToolLoopEscalated; block persists the call
    as failed with the refusal as its result and returns it in ``refused``), then the budgets
    (a tool call, a delegation; metered budgets must not be used up), raising BudgetExhausted.
    A raise persists and counts nothing of the call.

    ``model_step`` is the finished model step that made the call, numbered by the journal and
    written in the same transaction, before the call's step (it is persisted even when the call
    is refused or raises).

    The usual call (nothing to judge) is one transaction in two round trips on PostgreSQL: the
    fence with the run's limits and the duplicate-call count, then the steps, their counts and
    the commit; one round trip when ``expected`` (the run's rule as the caller last saw it)
    says the call is plain and the database confirms nothing it rests on changed
    (:func:`_steps_unchanged`). Anything else is rolled back and written by
    :func:`_tool_step_begin_exact`.
    """
    digest = tool_repeats.call_hash(name, tool_repeats.arguments_of(request))
    amounts = budgets.tool_call_amounts(name)
    row = step_sql.step_row(
        role=role,
        invocation=invocation,
        kind=StepKind.TOOL.value,
        status=status.value if isinstance(status, StepStatus) else status,
        name=name,
        idempotency_key=idempotency_key,
        request=request,
        lease_token=lease.token,
        call_hash=digest,
    )
    try:
        written = _steps_unchanged(lease, row, digest, amounts, model_step, expected)
        seq, rule = written or _steps_batch(lease, row, digest, amounts, model_step)
    except _NotPlain:
        if model_step is not None:
            model_step_write(lease, model_step)
        return _tool_step_begin_exact(lease, row=row, digest=digest)
    return ToolStart(seq, started_at=row["started_at"], rule=rule)


def _steps_batch(
    lease: Lease,
    row: dict[str, Any],
    digest: str,
    amounts: dict[str, int],
    model_step: ModelStep | None,
) -> tuple[int, ReadRule]:
    """Write a tool call's step (and the model step that made it) when there is nothing to
    judge: one transaction, two round trips on PostgreSQL (the fence with the run's limits and
    the duplicate-call count; then the steps, their counts and the commit). Returns the call's
    seq and the run's rule for reads; raises :class:`_NotPlain` (rolled back, nothing written)
    otherwise."""
    try:
        with db.batch() as batch:
            fence = batch.add(
                *budgets.fence_limits_sql(
                    lease,
                    step_increment=2 if model_step else 1,
                    release_admission=model_step is not None,
                    steps_before=model_step.steps_before if model_step else None,
                )
            )
            count = batch.add(*step_sql.occurrences(lease, digest))
            batch.sync()
            if not fence.rows:
                raise _NotHeld
            seq, _, limits = budgets.limits_from_fence(lease, fence.rows)
            verdict = tool_repeats.judge(int(count.rows[0][0]) + 1, limits.tool_loop)
            if not _plain(limits, amounts, verdict):
                raise _NotPlain
            _add_steps(batch, lease, row, amounts, model_step)
    except _NotHeld:
        _fence_failed(lease, model_step)
    return seq, read_rule(limits)


def _add_steps(
    batch: db.Batch,
    lease: Lease,
    row: dict[str, Any],
    amounts: dict[str, int],
    model_step: ModelStep | None,
    *,
    step_count: int | None = None,
) -> None:
    """The writes of a plain step after its fence: the model step (if any), the call's step,
    their counts; each guarded by ``step_count`` when given (``step_sql.FENCE_AT_COUNT``)."""
    usage = {metric: budgets.amount(n) for metric, n in amounts.items()}
    if model_step is not None:
        batch.add(*step_sql.insert_step(lease, model_step.row, seq_back=1, step_count=step_count))
        usage.update(model_step.charged)
    batch.add(*step_sql.insert_step(lease, row, step_count=step_count))
    high_water = model_step_charged(model_step)
    batch.add(
        *step_sql.usage_add(lease, usage, _day(), high_water=high_water, step_count=step_count)
    )


def _steps_unchanged(
    lease: Lease,
    row: dict[str, Any],
    digest: str,
    amounts: dict[str, int],
    model_step: ModelStep | None,
    expected: ReadRule | None,
) -> tuple[int, ReadRule] | None:
    """:func:`_steps_batch` in one round trip, when the caller's rule says the write is plain
    (PostgreSQL): the fence itself requires that nothing the judgement rests on changed since
    that rule was read (``budgets.fence_unchanged_sql``), and every other statement requires
    the step count that fence leaves, so the batch is committed without waiting for its
    answer. None when it does not apply or its fence matched nothing (then nothing was
    written, and the caller takes the path that reads the run first)."""
    limits = expected.limits if expected is not None else None
    if (
        limits is None
        or limits.fingerprint is None
        or model_step is None
        or model_step.steps_before is None
        or not db.batches_are_sent_together()
        or not _plain(limits, amounts, tool_repeats.RepeatVerdict.OK)
    ):
        return None
    policy = limits.tool_loop
    with db.batch() as batch:
        fence = batch.add(
            *budgets.fence_unchanged_sql(
                lease,
                limits,
                steps_before=model_step.steps_before,
                step_increment=2,
                call_hash=digest,
                # judge(earlier + 1) is OK exactly when earlier + 1 is below every threshold.
                occurrences_below=min(policy.warnAt, policy.blockAt, policy.escalateAt) - 1,
            )
        )
        _add_steps(batch, lease, row, amounts, model_step, step_count=model_step.steps_before + 2)
    if not fence.rows:
        return None
    assert expected is not None
    return int(fence.rows[0][0]), expected


def tool_step_record(
    lease: Lease,
    *,
    role: str,
    invocation: str,
    name: str,
    request: dict[str, Any],
    idempotency_key: str,
    response: Any,
    error: str,
    started_at: datetime,
    model_step: ModelStep | None = None,
    expected: ReadRule | None = None,
) -> ToolStart:
    """Persist a read-effect call that has already run, with its result, in one write.

    A call that changes nothing needs no durable start (after a crash it simply runs again),
    so its step is written once, completed, with the model step that made it
    (``model_step``): one transaction for the whole tool-loop step. The run's limits are
    applied exactly as :func:`tool_step_begin` applies them, the result of a refused call
    being discarded: blocked, the step records the refusal (``refused``); escalated or out of
    budget, it raises and persists nothing of the call.

    A call with something to judge (a warning, a limit) takes :func:`tool_step_begin`'s exact
    path: it comes back begun but not completed (``started_at`` set), and the caller completes
    it with the run's notice in its result.

    ``expected`` is the run's rule for reads as the caller last saw it: when it says the write
    is plain, the write is tried in one round trip that proves it still is.
    """
    now = timezone.now()
    digest = tool_repeats.call_hash(name, tool_repeats.arguments_of(request))
    amounts = budgets.tool_call_amounts(name)
    row = step_sql.step_row(
        role=role,
        invocation=invocation,
        kind=StepKind.TOOL.value,
        status=(StepStatus.FAILED if error else StepStatus.COMPLETED).value,
        name=name,
        idempotency_key=idempotency_key,
        request=request,
        response=response,
        error=error,
        lease_token=lease.token,
        call_hash=digest,
        started_at=started_at,
        finished_at=now,
        duration_ms=max(0, int((now - started_at).total_seconds() * 1000)),
    )
    try:
        written = _steps_unchanged(lease, row, digest, amounts, model_step, expected)
        seq, rule = written or _steps_batch(lease, row, digest, amounts, model_step)
    except _NotPlain:
        if model_step is not None:
            model_step_write(lease, model_step)
        started = {**row, "status": StepStatus.STARTED.value, "response": None, "error": ""}
        return _tool_step_begin_exact(
            lease, row={**started, "finished_at": None, "duration_ms": None}, digest=digest
        )
    return ToolStart(seq, rule=rule)


def _day() -> str:
    return timezone.now().astimezone(UTC).date().isoformat()


@transaction.atomic
def _tool_step_begin_exact(lease: Lease, *, row: dict[str, Any], digest: str) -> ToolStart:
    """:func:`tool_step_begin` with every limit judged, one statement after the other."""
    seq, limits = _touch(lease, step_increment=1)
    name = row["name"]
    count = _occurrence(lease, digest)
    verdict = tool_repeats.judge(count, limits.tool_loop)
    policy = limits.tool_loop
    if verdict is tool_repeats.RepeatVerdict.ESCALATE:
        raise tool_repeats.escalation(name, count, policy)
    if verdict is tool_repeats.RepeatVerdict.BLOCK:
        # Never run, so not a tool call for the budgets; the model gets the refusal.
        content = tool_repeats.block_message(name, count, policy)
        blocked = {
            **row,
            "status": StepStatus.FAILED.value,
            "error": content,
            "response": {"content": content, "disposition": "blocked"},
            "finished_at": timezone.now(),
        }
        _insert_step(lease, **blocked)
        step_event(
            lease, type="toolloop.blocked", data=tool_repeats.event_data(name, count, policy, seq)
        )
        return ToolStart(seq, refused=content)
    started_at = _insert_step(lease, **row)
    # The counts last: the pattern's day is a row every run of the pattern writes, so its lock
    # is taken as late as possible (a refusal rolls the step back with the rest).
    budgets.budget_take(limits, budgets.tool_call_amounts(name))
    budgets.require_room(limits)
    if verdict is tool_repeats.RepeatVerdict.WARN:
        step_event(
            lease, type="toolloop.warning", data=tool_repeats.event_data(name, count, policy, seq)
        )
        notice = tool_repeats.warning_notice(name, count, policy)
        return ToolStart(seq, notice=notice, started_at=started_at)
    return ToolStart(seq, started_at=started_at)


def step_complete(
    lease: Lease,
    seq: int,
    *,
    response: Any,
    error: str = "",
    tokens_in: int = 0,
    tokens_out: int = 0,
    cost: float = 0.0,
    started_at: datetime | None = None,
) -> None:
    """Record a step's result; a stale holder's result is refused by the fence.

    Tokens and cost a step reports are charged to the budgets once, when it first finishes.
    A caller that began the step itself passes its ``started_at``: a step with nothing to
    charge that was not approved (no approval to record) is then completed in one
    transaction of one round trip (the fence, the result)."""
    if started_at is not None and not (tokens_in or tokens_out or cost):
        result = step_sql.step_result(
            lease, now=timezone.now(), started_at=started_at, response=response, error=error
        )
        with db.batch() as batch:
            fence = batch.add(*fence_touch_sql(lease))
            done = batch.add(*step_sql.complete_unless_approved(lease, seq, result))
        if not fence.rows:
            raise LeaseLost(f"lease on run {lease.run_id} is no longer held by {lease.owner}")
        if done.rowcount == 1:
            return
    _step_complete_exact(
        lease, seq, response=response, error=error, tokens=(tokens_in, tokens_out), cost=cost
    )


@transaction.atomic
def _step_complete_exact(
    lease: Lease, seq: int, *, response: Any, error: str, tokens: tuple[int, int], cost: float
) -> None:
    """:func:`step_complete` for a step with something to charge or an approval to record."""
    fenced_touch(lease)
    tokens_in, tokens_out = tokens
    step_id, status, finished_at, began = (
        LoopStep.objects.select_for_update()
        .filter(run_id=lease.run_id, seq=seq)
        .values_list("id", "status", "finished_at", "started_at")
        .get()
    )
    if finished_at is None and (tokens_in or tokens_out or cost):
        budgets.budget_charge(
            budgets.run_limits(lease.run_id), tokens=tokens_in + tokens_out, cost=cost
        )
    if status == StepStatus.APPROVED:
        from loops.services.approvals import approval_record_execution

        request = LoopStep.objects.values_list("request", flat=True).get(pk=step_id)
        approval_record_execution(
            run_id=lease.run_id, step_seq=seq, arguments=(request or {}).get("arguments")
        )
    result = step_sql.step_result(
        lease,
        now=timezone.now(),
        started_at=began,
        response=response,
        error=error,
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        cost=_cost(cost),
    )
    LoopStep.objects.filter(pk=step_id).update(**result)


def step_record(
    lease: Lease,
    *,
    role: str,
    invocation: str,
    kind: str,
    name: str,
    request: dict[str, Any],
    response: Any,
    error: str = "",
    tokens_in: int = 0,
    tokens_out: int = 0,
    cost: float = 0.0,
    duration_ms: int | None = None,
) -> int:
    """Persist an already finished step in one write (model calls, reads).

    A model step charges its tokens and cost to the budgets (and ends the run's admission on
    a shared daily budget): :func:`model_step_write`. A tool step (a call answered without
    running) counts for the tool-loop policy and may raise ToolLoopEscalated, persisting
    nothing."""
    step = finished_step(
        lease,
        role=role,
        invocation=invocation,
        kind=kind,
        name=name,
        request=request,
        response=response,
        error=error,
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        cost=cost,
        duration_ms=duration_ms,
    )
    if kind != StepKind.MODEL:
        return _step_record_exact(lease, step.row)
    seq, _ = model_step_write(lease, step)
    return seq


@dataclass(frozen=True)
class ModelStep:
    """A finished step ready to be written: its row, and the tokens and cost it charges.

    ``seq`` is set when the lease holder's journal numbered it itself (it writes the step
    later, with its next write): the write then also requires the run to have exactly the
    steps before it."""

    row: dict[str, Any]
    charged: dict[str, Decimal]
    seq: int | None = None

    @property
    def steps_before(self) -> int | None:
        return None if self.seq is None else self.seq - 1


def finished_step(
    lease: Lease,
    *,
    role: str,
    invocation: str,
    kind: str,
    name: str,
    request: dict[str, Any],
    response: Any,
    error: str = "",
    tokens_in: int = 0,
    tokens_out: int = 0,
    cost: float = 0.0,
    duration_ms: int | None = None,
    seq: int | None = None,
) -> ModelStep:
    """A finished step (a model call, usually) as :func:`model_step_write` and
    :func:`tool_step_begin` write it."""
    now = timezone.now()
    row = step_sql.step_row(
        role=role,
        invocation=invocation,
        kind=kind,
        status=(StepStatus.FAILED if error else StepStatus.COMPLETED).value,
        name=name,
        request=request,
        response=response,
        error=error,
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        cost=_cost(cost),
        lease_token=lease.token,
        started_at=now,
        finished_at=now,
        duration_ms=duration_ms,
        call_hash=_hash_of(kind, name, request),
    )
    charged = {
        metric: n
        for metric, value in (("cost", cost), ("tokens", tokens_in + tokens_out))
        if (n := budgets.amount(value))
    }
    return ModelStep(row=row, charged=charged, seq=seq)


def model_step_charged(step: ModelStep | None) -> tuple[str, ...]:
    """The metered metrics a model step charges (their day's largest call is kept)."""
    return () if step is None else tuple(sorted(step.charged))


def model_step_write(lease: Lease, step: ModelStep) -> tuple[int, ReadRule]:
    """Persist a finished model step with its tokens and cost on the run and its pattern's
    day: one transaction of one round trip on PostgreSQL (every statement carries the fence,
    so a lost lease writes nothing). Returns its seq and the run's rule for reads."""
    with db.batch() as batch:
        fence = batch.add(
            *budgets.fence_limits_sql(
                lease, step_increment=1, release_admission=True, steps_before=step.steps_before
            )
        )
        batch.add(*step_sql.insert_step(lease, step.row))
        if step.charged:
            high_water = model_step_charged(step)
            batch.add(*step_sql.usage_add(lease, step.charged, _day(), high_water=high_water))
    if not fence.rows:
        _fence_failed(lease, step)
    seq, _, limits = budgets.limits_from_fence(lease, fence.rows)
    return seq, read_rule(limits)


class JournalOutOfStep(RuntimeError):
    """The run has other steps than the lease holder's journal numbered its own from: a bug
    (only the lease holder writes steps), refused rather than written under a wrong seq."""


def _fence_failed(lease: Lease, step: ModelStep | None) -> NoReturn:
    """The fence matched no row: the lease is lost, or (a bug) the journal's numbering is."""
    if step is not None and step.seq is not None:
        held = LoopRun.objects.filter(
            pk=lease.run_id, lease_owner=lease.owner, lease_token=lease.token
        ).values_list("step_count", flat=True)
        for steps in held:
            raise JournalOutOfStep(
                f"run {lease.run_id} has {steps} steps; its journal numbered step {step.seq}"
            )
    raise LeaseLost(f"lease on run {lease.run_id} is no longer held by {lease.owner}")


@transaction.atomic
def _step_record_exact(lease: Lease, row: dict[str, Any]) -> int:
    """:func:`step_record` of a step the tool-loop policy counts (a tool call answered
    without running) or a notice."""
    seq, limits = _touch(lease, step_increment=1)
    digest = row["call_hash"]
    if digest is not None:
        _judge_answered(lease, row["name"], digest, seq, limits.tool_loop)
    _insert_step(lease, **row)
    return seq


def _judge_answered(lease: Lease, name: str, digest: str, seq: int, policy: ToolLoopPolicy) -> None:
    """The tool-loop policy for a call the invoker answered without running it: it counts,
    warns from ``warnAt`` and escalates at ``escalateAt`` (there is nothing to block)."""
    count = tool_repeats.occurrence(lease.run_id, digest)
    verdict = tool_repeats.judge(count, policy)
    if verdict is tool_repeats.RepeatVerdict.ESCALATE:
        raise tool_repeats.escalation(name, count, policy)
    if verdict is not tool_repeats.RepeatVerdict.OK:
        step_event(
            lease,
            type="toolloop.warning",
            data=tool_repeats.event_data(name, count, policy, seq),
        )


@transaction.atomic
def step_event(lease: Lease, *, type: str, data: dict[str, Any]) -> int:
    _, seq = fenced_touch(lease, event_increment=1)
    LoopEvent.objects.create(run_id=lease.run_id, seq=seq, type=type, actor=lease.owner, data=data)
    return seq


def steps_of_invocation(run_id: uuid.UUID, invocation: str) -> list[StepRecord]:
    """The invocation's journal in order (a resume replays it): the columns it needs, read
    as rows and their JSON decoded here, with no model instances and none of the ORM's
    per-value converters (both grew the cost of a resume with its history)."""
    rows = db.fetch_all(_STEPS_SQL, [db.uuid_param(run_id), invocation])
    return [
        StepRecord(seq, kind, status, name, key, _decoded(request), _decoded(response), error)
        for seq, kind, status, name, key, request, response, error in rows
    ]


_STEPS_SQL = (
    "SELECT seq, kind, status, name, idempotency_key, request, response, error "
    "FROM loops_loopstep WHERE run_id = %s AND invocation = %s ORDER BY seq"
)


def _decoded(value: Any) -> Any:
    """A JSON column's value as ``JSONField`` gives it (NULL and JSON null: None)."""
    return json.loads(value) if isinstance(value, str | bytes) else value

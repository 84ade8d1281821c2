"""The batched paths of the step writes: one transaction of one or two round trips.

Each applies only when the write is plain (nothing for a limit to judge, an ordinary call for
the tool-loop policy); otherwise it raises :class:`loops.db.NotPlain` having written nothing,
and the store function in ``loops.services.steps`` takes the exact path (``step_exact``). The
one-round-trip variants need the batch sent together (``db.batches_are_sent_together``): their
statements carry their own guards, so the batch commits without waiting for an answer.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, NoReturn

from django.utils import timezone

from loops import db
from loops.models import LoopRun
from loops.services import budget_rules, budget_sql, budgets, step_sql, tool_repeats
from loops.services.step_records import (
    JournalOutOfStep,
    ModelStep,
    ReadRule,
    day,
    model_step_charged,
    plain,
    read_rule,
    starts_plainly,
)
from loops.services.transitions import Lease, fence_touch_sql
from orchestrator import wakeups
from runtime.invocation import LeaseLost


class _NotHeld(Exception):
    """A batch's fence matched no row (nothing was written); rolled back, then explained."""


def invocation_start(
    lease: Lease, role: str, invocation: str, expected: budget_rules.RunLimits | None
) -> tuple[budget_rules.InvocationStart, dict[str, int]]:
    """An invocation's start (or resume) with nothing to judge, and the run's tool calls so far
    by hash. One statement when ``expected`` (the run's limits as the caller last read them)
    says the start is plain and the database proves them unchanged; otherwise one transaction
    of two round trips. Raises NotPlain (nothing written) when a limit must judge the start or
    the batch is not sent together."""
    if not db.batches_are_sent_together():
        raise db.NotPlain
    unchanged = _invocation_begin_unchanged(lease, role, invocation, expected)
    return unchanged or _invocation_begin_batched(lease, role, invocation)


def tool_step(
    lease: Lease,
    row: dict[str, Any],
    digest: str,
    amounts: dict[str, int],
    model_step: ModelStep | None,
    expected: ReadRule | None,
) -> tuple[int, ReadRule]:
    """A plain tool call's step (and the model step that made it): one round trip when
    ``expected`` proves the write still plain (:func:`_steps_unchanged`), else two
    (:func:`_steps_batch`). Returns the call's seq and the run's rule for reads."""
    written = _steps_unchanged(lease, row, digest, amounts, model_step, expected)
    return written or _steps_batch(lease, row, digest, amounts, model_step)


def step_complete(
    lease: Lease,
    seq: int,
    *,
    response: Any,
    error: str,
    started_at: datetime | None,
    charged: bool,
) -> None:
    """A step's result in one transaction of one round trip (the fence, the result), for a
    step the caller began itself (``started_at``) with nothing to charge. Raises NotPlain
    otherwise, and for an approved call (then only the fence's touch was written: the exact
    path records the call's execution)."""
    if started_at is None or charged:
        raise db.NotPlain
    result = step_sql.step_result(
        lease, now=timezone.now(), started_at=started_at, response=response, error=error
    )
    with db.batch() as batch:
        fence = batch.add(*fence_touch_sql(lease))
        done = batch.add(*step_sql.complete_unless_approved(lease, seq, result))
    if not fence.rows:
        raise LeaseLost(f"lease on run {lease.run_id} is no longer held by {lease.owner}")
    if done.rowcount != 1:
        raise db.NotPlain


def _invocation_begin_unchanged(
    lease: Lease, role: str, invocation: str, expected: budget_rules.RunLimits | None
) -> tuple[budget_rules.InvocationStart, dict[str, int]] | None:
    """The start in one statement (``step_sql.invocation_start_unchanged``) when ``expected``
    says it is plain; a resumed invocation (already started) is answered by the same
    statement. None when it does not apply or the limits changed (nothing was written)."""
    if expected is None or expected.fingerprint is None or not starts_plainly(expected, role):
        return None
    amounts = budget_rules.invocation_amounts(role)
    usage = {metric: budget_rules.amount(n) for metric, n in amounts.items()}
    statement = step_sql.invocation_start_unchanged(
        lease, expected.fingerprint, invocation=invocation, role=role, amounts=usage, day=day()
    )
    with db.batch() as batch:
        found = batch.add(*statement)
        wakeups.touched(lease.run_id)
    if not found.rows:
        raise LeaseLost(f"lease on run {lease.run_id} is no longer held by {lease.owner}")
    event_seq, started, steps, pattern_id, snapshot, pattern_policy, calls = found.rows[0]
    limits = budget_rules.limits_from_row(lease.run_id, pattern_id, snapshot, pattern_policy)
    pairs = json.loads(calls) if isinstance(calls, str) else calls  # jsonb comes as its text
    counts = {str(digest): int(n) for digest, n in pairs or []}
    if event_seq is not None:
        return budget_rules.InvocationStart(True, False, int(steps), limits), counts
    if started:
        resumed = budget_rules.InvocationStart(
            False, budget_rules.metered(limits), int(steps), limits
        )
        return resumed, counts
    return None


def _invocation_begin_batched(
    lease: Lease, role: str, invocation: str
) -> tuple[budget_rules.InvocationStart, dict[str, int]]:
    with db.batch() as batch:
        started = batch.add(*step_sql.invocation_started(lease, invocation))
        fence = batch.add(*budget_sql.fence_limits_sql(lease))
        calls = batch.add(*step_sql.call_counts(lease))
        batch.sync()
        steps, _, limits = budgets.limits_from_fence(lease, fence.rows)  # none: LeaseLost
        counts = {str(digest): int(n) for digest, n in calls.rows}
        if started.rows[0][0]:
            resumed = budget_rules.InvocationStart(
                False, budget_rules.metered(limits), steps, limits
            )
            return resumed, counts
        amounts = budget_rules.invocation_amounts(role)
        if not starts_plainly(limits, role):
            raise db.NotPlain
        batch.add(*fence_touch_sql(lease, event_increment=1))
        data = {"invocation": invocation, "role": role}
        batch.add(*step_sql.insert_event(lease, budget_rules.INVOCATION_STARTED, data))
        usage = {metric: budget_rules.amount(n) for metric, n in amounts.items()}
        batch.add(*step_sql.usage_add(lease, usage, day()))
    return budget_rules.InvocationStart(True, False, steps, limits), counts


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
    seq and the run's rule for reads; otherwise raises NotPlain (rolled back, nothing
    written)."""
    try:
        with db.batch() as batch:
            fence = batch.add(
                *budget_sql.fence_limits_sql(
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
            if not plain(limits, amounts, verdict):
                raise db.NotPlain
            _add_steps(batch, lease, row, amounts, model_step)
    except _NotHeld:
        fence_failed(lease, model_step)
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
    usage = {metric: budget_rules.amount(n) for metric, n in amounts.items()}
    if model_step is not None:
        batch.add(*step_sql.insert_step(lease, model_step.row, seq_back=1, step_count=step_count))
        usage.update(model_step.charged)
    batch.add(*step_sql.insert_step(lease, row, step_count=step_count))
    high_water = model_step_charged(model_step)
    batch.add(
        *step_sql.usage_add(lease, usage, day(), high_water=high_water, step_count=step_count)
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
    that rule was read (``budget_sql.fence_unchanged_sql``), and every other statement requires
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
        or not plain(limits, amounts, tool_repeats.RepeatVerdict.OK)
    ):
        return None
    policy = limits.tool_loop
    with db.batch() as batch:
        fence = batch.add(
            *budget_sql.fence_unchanged_sql(
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


def model_step_write(lease: Lease, step: ModelStep) -> tuple[int, ReadRule]:
    """Persist a finished model step with its tokens and cost on the run and its pattern's
    day: one transaction of one round trip on PostgreSQL (every statement carries the fence,
    so a lost lease writes nothing). Returns its seq and the run's rule for reads."""
    with db.batch() as batch:
        fence = batch.add(
            *budget_sql.fence_limits_sql(
                lease, step_increment=1, release_admission=True, steps_before=step.steps_before
            )
        )
        batch.add(*step_sql.insert_step(lease, step.row))
        if step.charged:
            high_water = model_step_charged(step)
            batch.add(*step_sql.usage_add(lease, step.charged, day(), high_water=high_water))
    if not fence.rows:
        fence_failed(lease, step)
    seq, _, limits = budgets.limits_from_fence(lease, fence.rows)
    return seq, read_rule(limits)


def fence_failed(lease: Lease, step: ModelStep | None) -> NoReturn:
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

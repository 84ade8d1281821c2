"""Budgets: per-run and daily (per pattern) limits, counted in usage buckets.

Five metrics (``PatternPolicy.budgets``): ``invocations``, ``toolCalls`` and
``verifications`` are *counted* (one unit each, known before the thing starts); ``tokens`` and
``cost`` are *metered* (known only after a model call). Usage lives in ``UsageBucket`` rows keyed
by scope and metric: ``run:<run id>`` for the run's own usage and ``pattern:<pattern pk>:<UTC
date>`` for the pattern's day. Usage is always counted, with or without a limit, so a limit
added or raised later starts from the true figure.

When each is counted, always in the same fenced transaction as the journal write it belongs to
(a crash either keeps both or neither, so nothing is counted twice or lost):

* an invocation when the engine starts it (``invocation.started`` event; a resumed invocation
  is not counted again); the verifier's invocation also counts a verification;
* a tool call when its step begins or is gated (``toolCalls``); a re-issued call after a
  crash is the same step, not counted;
* tokens and cost when a model step is recorded (and any a tool step reports on completion).

Counted metrics take their unit with a conditional ``UPDATE … WHERE value <= limit - n``, so
usage never passes the limit even with parallel writers (PostgreSQL re-checks the condition
on the row it waited for; SQLite serialises writers). Metered metrics cannot be reserved:
before a model call starts the run must still have room (``used < limit``), so a run overshoots
by at most the one call that crossed the limit. On a shared daily tokens/cost budget, parallel
runs of the pattern could each cross with a call in flight; :func:`budget_admit_model_call`
therefore admits a call while another is in flight only when the remaining headroom is large
compared with the largest call charged so far that day (``PARALLEL_MARGIN`` times it per call
in flight), and otherwise one call at a time, so the pattern overshoots by at most one call in
total (docs/runs.md, "Budgets"). Per-run limits come from the run's ``policy_snapshot`` (which
``run_budget_raise`` may raise); daily limits from the pattern's current policy, because the
day's budget is one shared pool whatever each run pinned.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest, Now
from django.utils import timezone
from pydantic import ValidationError

from loops import state
from loops.models import LoopEvent, LoopPattern, LoopRun, UsageBucket
from loops.policy import Budget, pydantic_errors
from loops.services import budget_sql
from loops.services.budget_rules import (
    ADMISSION_RETRY_SECONDS,
    DAILY,
    INVOCATION_STARTED,
    METERED,
    METRICS,
    BudgetAdmission,
    Exhausted,
    InvocationStart,
    RunLimits,
    amount,
    daily_scope,
    has_room,
    high_water_metric,
    invocation_amounts,
    limits_from_row,
    limits_of,
    metered,
    number,
    parallel_admissible,
    policy_of,
    raise_problem,
    spent_message,
)
from loops.services.budget_sql import fence_limits_sql
from loops.services.harness_limits import HarnessLimits, tightened
from loops.services.transitions import Lease, run_event_append
from orchestrator.errors import Conflict, InvalidInput
from orchestrator.sql import execute, fetch_all, fetch_all_prepared, is_postgres
from runtime.invocation import LeaseLost


def limits_from_fence(lease: Lease, rows: list[tuple[Any, ...]]) -> tuple[int, int, RunLimits]:
    """(step count, event seq, limits) from the fence's ``RETURNING``; no row: LeaseLost."""
    if not rows:
        raise LeaseLost(f"lease on run {lease.run_id} is no longer held by {lease.owner}")
    steps, events, pattern_id, snapshot, pattern_policy = rows[0]
    limits = limits_from_row(lease.run_id, pattern_id, snapshot, pattern_policy)
    return int(steps), int(events), limits


def fenced_limits(
    lease: Lease,
    *,
    step_increment: int = 0,
    event_increment: int = 0,
    release_admission: bool = False,
) -> tuple[int, int, RunLimits]:
    """:func:`~loops.services.transitions.fenced_touch` that also reads the run's limits in the
    same statement (``RETURNING``); ``release_admission`` also ends the run's admission on its
    pattern's day (``model_call_token``, for a model step). Returns the new step count, the new
    event seq and the limits.

    The limits come from the updated row (its ``policy_snapshot``, so a raise is seen) and the
    pattern's current policy: exactly what :func:`run_limits` reads, one round trip fewer. The
    UPDATE takes the run's row lock first, as ``fenced_touch`` does."""
    sql, params = fence_limits_sql(
        lease,
        step_increment=step_increment,
        event_increment=event_increment,
        release_admission=release_admission,
    )
    return limits_from_fence(lease, fetch_all(sql, params))


def run_limits(run_id: uuid.UUID, now: datetime | None = None) -> RunLimits:
    """Read a run's limits from the database (so a raise is seen at the next check)."""
    rows = fetch_all(*budget_sql.run_limits_sql(run_id))
    if not rows:
        raise LoopRun.DoesNotExist(f"run {run_id} does not exist")
    pattern_id, snapshot, pattern_policy = rows[0]
    return limits_from_row(run_id, pattern_id, snapshot, pattern_policy, now)


def _ensure(scope: str, metrics: Iterable[str]) -> None:
    UsageBucket.objects.bulk_create(
        [UsageBucket(scope=scope, metric=m) for m in metrics], ignore_conflicts=True
    )


_USAGE_SQL = "SELECT metric, value FROM loops_usagebucket WHERE scope = %s AND metric = ANY(%s)"


def usage(scope: str, metrics: Iterable[str]) -> dict[str, Decimal]:
    """What ``scope`` has used of each of ``metrics`` (0 for a bucket not made yet). On
    PostgreSQL one prepared read (an invocation's start asks for its harness-bound metrics)."""
    wanted = list(metrics)
    if not wanted:
        return {}
    if is_postgres():
        rows = dict(fetch_all_prepared("lw_usage_of_scope", _USAGE_SQL, [scope, wanted]))
    else:
        buckets = UsageBucket.objects.filter(scope=scope, metric__in=wanted)
        rows = dict(buckets.values_list("metric", "value"))
    return {m: amount(rows.get(m) or 0) for m in wanted}


def _lock(scope: str, metrics: list[str]) -> dict[str, Decimal]:
    """Lock a scope's buckets (sorted by metric, the one order every writer uses)."""
    _ensure(scope, metrics)
    rows = UsageBucket.objects.select_for_update().filter(scope=scope, metric__in=metrics)
    values = dict(rows.order_by("metric").values_list("metric", "value"))
    return {m: amount(values.get(m) or 0) for m in metrics}


def _upsert(scope: str, metric: str, n: Decimal, limit: Decimal | None) -> bool:
    """Add ``n`` to the bucket unless the sum would pass ``limit`` (``budget_sql.upsert_sql``);
    whether it was added."""
    if limit is not None and n > limit:
        return False
    return execute(*budget_sql.upsert_sql(scope, metric, n, limit)) == 1


def _take(
    limits: RunLimits, kind: str, scope: str, metric: str, n: Decimal, limit: Decimal | None
) -> Exhausted | None:
    """Add ``n`` unless that would pass ``limit``; else what the budget stands at."""
    if _upsert(scope, metric, n, limit):
        return None
    assert limit is not None
    used = usage(scope, [metric])[metric]
    return Exhausted(kind, scope, metric, used, limit, limits.bound(kind, metric))


def _add_many(rows: list[tuple[str, str, Decimal]]) -> None:
    """Add to several buckets whatever their limits, in one statement (rows in the one order
    every writer uses: per-run scope first, then the day, metrics sorted)."""
    if rows:
        execute(*budget_sql.add_many_sql(rows))


def _raise_to(scope: str, metric: str, n: Decimal) -> None:
    _ensure(scope, [metric])
    UsageBucket.objects.filter(scope=scope, metric=metric).update(
        value=Greatest(F("value"), Value(n)), updated_at=timezone.now()
    )


def budget_take(limits: RunLimits, amounts: Mapping[str, int]) -> None:
    """Take counted units on the run and the pattern's day, or raise :class:`BudgetExhausted`.

    Call inside the transaction of the write it belongs to: a refusal raises, which rolls back
    whatever this transaction already took.
    """
    sections = limits.sections()
    if not any(metric in bounds for _k, _s, bounds in sections for metric in amounts):
        # Nothing to judge (the usual case): count it everywhere in one statement.
        _add_many(
            [
                (scope, metric, amount(amounts[metric]))
                for _kind, scope, _bounds in sections
                for metric in sorted(amounts)
            ]
        )
        return
    for kind, scope, bounds in sections:
        for metric in sorted(amounts):
            n, limit = amount(amounts[metric]), bounds.get(metric)
            refused = _take(limits, kind, scope, metric, n, limit)
            if refused is not None:
                raise refused.error()


def require_room(limits: RunLimits, metrics: Iterable[str] = METERED) -> None:
    """Raise :class:`BudgetExhausted` when a metered budget of the run is used up."""
    wanted = sorted(metrics)
    for kind, scope, bounds in limits.sections():
        bounded = [m for m in wanted if m in bounds]
        if not bounded:
            continue
        for metric, used in usage(scope, bounded).items():
            if not has_room(used, bounds[metric]):
                bound = limits.bound(kind, metric)
                raise Exhausted(kind, scope, metric, used, bounds[metric], bound).error()


def budget_charge(
    limits: RunLimits, *, tokens: int, cost: float | Decimal, release_admission: bool = True
) -> None:
    """Add a finished call's tokens and cost to the run and its pattern's day (in the
    transaction that persists the call, one statement), and release the run's admission on
    the day (``release_admission=False``: the caller's fenced update already did)."""
    charged = {"cost": amount(cost), "tokens": amount(tokens)}
    _add_many(
        [
            (scope, metric, n)
            for _kind, scope, _bounds in limits.sections()
            for metric, n in sorted(charged.items())
            if n
        ]
    )
    for metric, n in sorted(charged.items()):
        if n:  # always kept, so a daily limit added later weighs the day's true largest call
            _raise_to(limits.day, high_water_metric(metric), n)
    if release_admission:
        LoopRun.objects.filter(pk=limits.run_id, model_call_token__isnull=False).update(
            model_call_token=None
        )


def budget_invocation_start(lease: Lease, *, role: str, invocation: str) -> bool:
    """Count an invocation (and a verification for the verifier) as it starts, once.

    Returns False for a resumed invocation (already counted). Raises :class:`BudgetExhausted`
    when a budget has no room for it, counting nothing.
    """
    return budget_invocation_begin(lease, role=role, invocation=invocation).started


@transaction.atomic
def budget_invocation_begin(
    lease: Lease, *, role: str, invocation: str, harness: HarnessLimits | None = None
) -> InvocationStart:
    """:func:`budget_invocation_start`, also saying whether model calls need admission.

    ``harness``: the role's harness limits, judged with the budgets (``harness_limits``); the
    start's answer carries the run's own limits, as if there were none."""
    # Read before the fence: only the lease holder writes this event, and every earlier
    # holder's writes committed before our claim did (the claim waits for their row lock).
    started = LoopEvent.objects.filter(
        run_id=lease.run_id, type=INVOCATION_STARTED, data__invocation=invocation
    ).exists()
    steps, seq, limits = fenced_limits(lease, event_increment=0 if started else 1)
    if started:
        return InvocationStart(started=False, metered=metered(limits), steps=steps, limits=limits)
    LoopEvent.objects.create(
        run_id=lease.run_id,
        seq=seq,
        type=INVOCATION_STARTED,
        actor=lease.owner,
        data={"invocation": invocation, "role": role},
    )
    # The counts last (a refusal rolls the event back): shared rows are locked briefly.
    judged = tightened(limits, harness)
    budget_take(judged, invocation_amounts(role))
    require_room(judged)
    return InvocationStart(started=True, metered=metered(limits), steps=steps, limits=limits)


def _live_calls(pattern_id: int, run_id: uuid.UUID) -> int:
    """Model calls of other runs of the pattern admitted on the day and not charged yet,
    whose lease is alive (a dead lease's admission holds nothing). Database clock."""
    return (
        LoopRun.objects.filter(
            pattern_id=pattern_id,
            model_call_token=F("lease_token"),
            lease_owner__isnull=False,
            lease_expires_at__gt=Now(),
        )
        .exclude(pk=run_id)
        .count()
    )


def budget_admit_model_call(lease: Lease) -> float | None:
    """May the run's next model call start now? None: yes (admitted). A number: ask again
    after that many seconds (another run's call is in flight near a shared limit). Raises
    :class:`BudgetExhausted` when a tokens or cost budget is used up."""
    return budget_admission(lease).wait


@transaction.atomic
def budget_admission(lease: Lease, harness: HarnessLimits | None = None) -> BudgetAdmission:
    """:func:`budget_admit_model_call`, also saying whether any metered limit binds the run.

    A run bound by none needs no admission (nothing can be used up, nothing is shared): the
    engine's journal then skips asking before each model call, re-asking at least every
    ``ADMISSION_RECHECK_SECONDS`` (a daily limit may be added to the pattern meanwhile; the
    run's own limits can only be raised or removed). ``harness``: the role's harness limits,
    judged with the run's own (the journal passes them when its tally nears one)."""
    _, _, limits = fenced_limits(lease)
    if harness is not None and harness.bounds:
        require_room(tightened(limits, harness))
    wait = _admit(lease, limits)
    return BudgetAdmission(wait=wait, metered=metered(limits))


def _admit(lease: Lease, limits: RunLimits) -> float | None:
    require_room(limits)
    shared = sorted(m for m in METERED if m in limits.daily)
    if not shared:
        return None
    used = _lock(limits.day, shared)  # serialises admissions on the pattern's day
    for metric in shared:
        if not has_room(used[metric], limits.daily[metric]):
            raise Exhausted(DAILY, limits.day, metric, used[metric], limits.daily[metric]).error()
    in_flight = _live_calls(limits.pattern_id, lease.run_id)
    high = usage(limits.day, [high_water_metric(m) for m in shared])
    for metric in shared:
        top = high[high_water_metric(metric)]
        if not parallel_admissible(used[metric], limits.daily[metric], in_flight, top):
            return ADMISSION_RETRY_SECONDS
    LoopRun.objects.filter(pk=lease.run_id, lease_token=lease.token).update(
        model_call_token=lease.token
    )
    return None


def daily_exhaustion(pattern: LoopPattern, now: datetime | None = None) -> Exhausted | None:
    """The first daily budget of the pattern that is used up today, if any."""
    policy = policy_of(pattern.policy)
    if policy is None:
        return None
    bounds = limits_of(policy.budgets.daily)
    scope = daily_scope(pattern.pk, now or timezone.now())
    for metric, used in usage(scope, sorted(bounds)).items():
        if used >= bounds[metric]:
            return Exhausted(DAILY, scope, metric, used, bounds[metric])
    return None


def daily_budget_refusal(pattern: LoopPattern, now: datetime | None = None) -> str | None:
    """Why the pattern refuses new runs because of its daily budget, or None."""
    now = now or timezone.now()
    spent = daily_exhaustion(pattern, now)
    return spent_message(spent, now) if spent else None


def _raised_limits(current: Budget, raised: Budget) -> dict[str, dict[str, Any]]:
    """metric → {from, to} for every metric the request changes (``to`` None: no limit any
    more; a metric set to its current limit is no change); refuses any lowering, naming every
    offending metric."""
    changes: dict[str, dict[str, Any]] = {}
    errors = []
    for metric in sorted(raised.model_fields_set):
        old, new = getattr(current, metric), getattr(raised, metric)
        problem = raise_problem(metric, old, new)
        if problem:
            errors.append({"pointer": f"/perRun/{metric}", "detail": problem, "code": "lower"})
        elif old != new:
            changes[metric] = {"from": old, "to": new}
    if errors:
        raise InvalidInput(f"Budgets can only be raised: {errors[0]['detail']}.", errors=errors)
    return changes


def _parse_budget(data: Any) -> Budget:
    try:
        return Budget.model_validate(data)
    except ValidationError as exc:
        errors = pydantic_errors(exc, "/perRun", Budget)
        raise InvalidInput(f"The budget is invalid: {errors[0]['detail']}", errors=errors) from exc


@transaction.atomic
def run_budget_raise(*, run_id: uuid.UUID, per_run: Any, actor: str) -> LoopRun:
    """Raise limits of the run's own budget (merged into its ``policy_snapshot``).

    Only raising is allowed: every given metric gets a limit at least as high as the run's, or
    ``null`` for no limit (to hold a run back, pause or cancel it instead). A run that is still
    going sees the new limits at its next check; a blocked run continues after ``resume``.
    Daily limits belong to the pattern: raise them by updating the pattern's policy. A request
    that changes no limit writes nothing (no ``budget.raised`` event).
    """
    run = LoopRun.objects.select_for_update().get(pk=run_id)
    if run.status in {s.value for s in state.TERMINAL}:
        raise Conflict(
            f"Cannot change the budget of a run that is '{run.status}'.",
            current_status=run.status,
        )
    raised = _parse_budget(per_run)
    if not raised.model_fields_set:
        raise InvalidInput(
            "Name at least one perRun limit to raise.",
            errors=[{"pointer": "/perRun", "detail": "is empty", "code": "required"}],
        )
    snapshot = dict(run.policy_snapshot or {})
    budgets = dict(snapshot.get("budgets") or {})
    current = _parse_budget(budgets.get("perRun") or {})
    changes = _raised_limits(current, raised)
    if not changes:
        return run
    merged = current.model_copy(update={m: c["to"] for m, c in changes.items()})
    budgets["perRun"] = merged.model_dump(mode="json")
    snapshot["budgets"] = budgets
    LoopRun.objects.filter(pk=run.pk).update(policy_snapshot=snapshot, updated_at=timezone.now())
    run_event_append(run_id=run.pk, type="budget.raised", actor=actor, data={"perRun": changes})
    return LoopRun.objects.get(pk=run.pk)


def run_budget_usage(run: LoopRun, now: datetime | None = None) -> dict[str, Any]:
    """What the run and its pattern's day used, against their limits (for the API)."""
    limits = run_limits(run.pk, now)
    out: dict[str, Any] = {}
    for kind, scope, bounds in limits.sections():
        used = usage(scope, METRICS)
        out[kind] = {
            "scope": scope,
            **{
                metric: {
                    "used": number(metric, used[metric]),
                    "limit": number(metric, bounds[metric]) if metric in bounds else None,
                }
                for metric in METRICS
            },
        }
    return out

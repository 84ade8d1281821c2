"""Budgets: per-run and daily (per pattern) limits, counted in usage buckets.

Six metrics (``PatternPolicy.budgets``): ``invocations``, ``toolCalls``, ``delegations`` and
``verifications`` are *counted* (one unit each, known before the thing starts); ``tokens`` and
``cost`` are *metered* (known only after a model call). Usage lives in ``UsageBucket`` rows keyed
by scope and metric: ``run:<run id>`` for the run's own usage and ``pattern:<pattern pk>:<UTC
date>`` for the pattern's day. Usage is always counted, with or without a limit, so a limit
added or raised later starts from the true figure.

When each is counted, always in the same fenced transaction as the journal write it belongs to
(a crash either keeps both or neither, so nothing is counted twice or lost):

* an invocation when the engine starts it (``invocation.started`` event; a resumed invocation
  is not counted again); the verifier's invocation also counts a verification;
* a tool call when its step begins or is gated (``toolCalls``; a call of a delegation tool
  also counts ``delegations``); a re-issued call after a crash is the same step, not counted;
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

import functools
import hashlib
import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest, Now
from django.utils import timezone
from pydantic import ValidationError

from loops import db, state
from loops.models import LoopEvent, LoopPattern, LoopRun, UsageBucket
from loops.policy import Budget, PatternPolicy, ToolLoopPolicy, pydantic_errors
from loops.services.transitions import Lease, run_event_append
from orchestrator.errors import Conflict, InvalidInput
from runtime.invocation import BudgetExhausted, LeaseLost

COUNTED = ("invocations", "toolCalls", "delegations", "verifications")
METERED = ("tokens", "cost")
METRICS = (*COUNTED, *METERED)
PER_RUN, DAILY = "perRun", "daily"
#: Tools whose calls are delegations to another employee (counted as tool calls too).
DELEGATION_TOOLS = frozenset({"dispatch_sub_agent_task"})
#: A parallel model call is admitted only while the headroom covers this many times the
#: largest call charged today for every call in flight (calls grow as conversations do).
PARALLEL_MARGIN = 2
#: How long a model call waits before asking again for admission on a shared budget.
ADMISSION_RETRY_SECONDS = 0.2
_QUANTUM = Decimal("0.000001")


# --- pure arithmetic ---------------------------------------------------------------------------


def run_scope(run_id: uuid.UUID) -> str:
    return f"run:{run_id}"


def daily_scope(pattern_id: int, now: datetime) -> str:
    """The pattern's bucket scope for the UTC day of ``now``."""
    return f"pattern:{pattern_id}:{now.astimezone(UTC).date().isoformat()}"


def next_reset(now: datetime) -> datetime:
    """When the daily budgets start over: the next 00:00 UTC."""
    day = now.astimezone(UTC).date() + timedelta(days=1)
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def high_water_metric(metric: str) -> str:
    """The bucket that keeps the largest single charge of a metered metric in a scope."""
    return f"{metric}:max_call"


def limits_of(budget: Budget) -> dict[str, Decimal]:
    """The bounded metrics of a budget section, as decimals."""
    return {
        metric: amount(value)
        for metric in METRICS
        if (value := getattr(budget, metric)) is not None
    }


def amount(value: Any) -> Decimal:
    return Decimal(str(value)).quantize(_QUANTUM)


def fits(used: Decimal, n: Decimal, limit: Decimal) -> bool:
    """A counted unit may be taken: usage after it stays within the limit."""
    return used + n <= limit


def has_room(used: Decimal, limit: Decimal) -> bool:
    """A metered call may start: the budget is not used up yet."""
    return used < limit


def parallel_admissible(used: Decimal, limit: Decimal, in_flight: int, high_water: Decimal) -> bool:
    """May a model call start beside ``in_flight`` others on a shared metered budget?

    Alone, whenever there is room. Beside others only when, counting each call in flight (and
    this one) at ``PARALLEL_MARGIN`` times the largest call charged so far, the budget still
    holds them all; an unknown size (nothing charged yet) never runs in parallel.
    """
    if not has_room(used, limit):
        return False
    if in_flight == 0:
        return True
    if high_water <= 0:
        return False
    return used + (in_flight + 1) * PARALLEL_MARGIN * high_water <= limit


def number(metric: str, value: Decimal) -> int | float:
    """A usage figure for JSON: whole units for everything but cost."""
    return float(value) if metric == "cost" else int(value)


def shown(metric: str, value: Decimal) -> str:
    return f"{number(metric, value):g}" if metric == "cost" else str(int(value))


@dataclass(frozen=True)
class Exhausted:
    """A budget without room: which one, and how far it was used."""

    kind: str
    scope: str
    metric: str
    used: Decimal
    limit: Decimal

    @property
    def code(self) -> str:
        return f"budget_exhausted:{self.metric}"

    @property
    def reason(self) -> str:
        label = "per-run" if self.kind == PER_RUN else "daily"
        figures = f"{shown(self.metric, self.used)}/{shown(self.metric, self.limit)}"
        return f"{label} budget {self.metric} exhausted ({figures})"

    def data(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "kind": self.kind,
            "metric": self.metric,
            "used": number(self.metric, self.used),
            "limit": number(self.metric, self.limit),
        }

    def error(self) -> BudgetExhausted:
        return BudgetExhausted(self.reason, code=self.code, data=self.data())


# --- what a run is bound by --------------------------------------------------------------------


@dataclass(frozen=True)
class RunLimits:
    """A run's limits at one moment: its own (snapshot), its pattern's day, its tool-loop."""

    run_id: uuid.UUID
    pattern_id: int
    per_run: dict[str, Decimal]
    daily: dict[str, Decimal]
    tool_loop: ToolLoopPolicy
    day: str
    #: MD5s of the two JSON texts the limits were read from, as the database renders them
    #: (None when they came decoded): :func:`fence_unchanged_sql` proves them unchanged.
    fingerprint: tuple[str, str] | None = None

    def sections(self) -> list[tuple[str, str, dict[str, Decimal]]]:
        """(kind, scope, limits), per-run first: the order buckets are always touched in."""
        return [(PER_RUN, run_scope(self.run_id), self.per_run), (DAILY, self.day, self.daily)]


def _policy(data: Any) -> PatternPolicy | None:
    try:
        return PatternPolicy.model_validate(data or {})
    except ValidationError:
        return None


@dataclass(frozen=True)
class _Parsed:
    per_run: dict[str, Decimal]
    daily: dict[str, Decimal]
    tool_loop: ToolLoopPolicy
    fingerprint: tuple[str, str]


def _as_text(value: Any) -> str:
    """A JSON column as its text: the key of the parse cache (raw SQL returns text)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


@functools.lru_cache(maxsize=512)
def _parsed(snapshot: str, pattern_policy: str) -> _Parsed:
    """The limits of a (run snapshot, pattern policy) pair of JSON texts. Cached: the texts
    only change when a policy does, and validating them is most of a step's CPU otherwise."""
    pinned = _policy(json.loads(snapshot) if snapshot else {}) or PatternPolicy()
    # The day's budget is the pattern's as it stands now; a stored policy that no longer
    # parses (it was validated when saved) falls back to what the run pinned.
    current = (_policy(json.loads(pattern_policy)) if pattern_policy else None) or pinned
    return _Parsed(
        per_run=limits_of(pinned.budgets.perRun),
        daily=limits_of(current.budgets.daily),
        tool_loop=pinned.toolLoop,
        fingerprint=(_md5(snapshot), _md5(pattern_policy)),
    )


def _md5(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


def limits_from_row(
    run_id: uuid.UUID,
    pattern_id: int,
    snapshot: Any,
    pattern_policy: Any,
    now: datetime | None = None,
) -> RunLimits:
    """A run's limits from its row's ``policy_snapshot`` and its pattern's ``policy`` (JSON
    text as raw SQL returns it, or decoded), read by the caller in its own statement."""
    parsed = _parsed(_as_text(snapshot), _as_text(pattern_policy))
    as_stored = all(value is None or isinstance(value, str) for value in (snapshot, pattern_policy))
    return RunLimits(
        run_id=run_id,
        pattern_id=int(pattern_id),
        per_run=dict(parsed.per_run),
        daily=dict(parsed.daily),
        tool_loop=parsed.tool_loop,
        day=daily_scope(int(pattern_id), now or timezone.now()),
        fingerprint=parsed.fingerprint if as_stored else None,
    )


#: The columns :func:`limits_from_row` needs, for a statement on ``loops_looprun`` (a
#: ``RETURNING`` list or a ``SELECT``): pattern id, pinned snapshot, the pattern's policy now.
LIMIT_COLUMNS = (
    "pattern_id, policy_snapshot, "
    "(SELECT p.policy FROM loops_looppattern p WHERE p.id = loops_looprun.pattern_id)"
)


def fence_limits_sql(
    lease: Lease,
    *,
    step_increment: int = 0,
    event_increment: int = 0,
    release_admission: bool = False,
    steps_before: int | None = None,
) -> tuple[str, list[Any]]:
    """The statement of :func:`fenced_limits`, for a caller that sends it in a batch (its one
    row, or none when the lease is lost, goes to :func:`limits_from_fence`). ``steps_before``
    also requires the run's step count to be that (a journal that numbered its steps itself)."""
    release = ", model_call_token = NULL" if release_admission else ""
    expected = "" if steps_before is None else " AND step_count = %s"
    sql = (
        "UPDATE loops_looprun SET step_count = step_count + %s, "  # noqa: S608 (constants)
        f"event_seq = event_seq + %s, updated_at = {db.now_sql()}{release} "
        f"WHERE id = %s AND lease_owner = %s AND lease_token = %s{expected} "
        f"RETURNING step_count, event_seq, {LIMIT_COLUMNS}"
    )
    params = [step_increment, event_increment, db.uuid_param(lease.run_id), lease.owner]
    return sql, [*params, lease.token, *([] if steps_before is None else [steps_before])]


def fence_unchanged_sql(
    lease: Lease,
    limits: RunLimits,
    *,
    steps_before: int,
    step_increment: int,
    call_hash: str,
    occurrences_below: int,
) -> tuple[str, list[Any]]:
    """The fence of :func:`fence_limits_sql` (PostgreSQL) that also requires what made a write
    plain when the caller last read the run: the run has exactly ``steps_before`` steps, its
    policy snapshot and its pattern's policy are the texts ``limits`` were read from (their
    MD5s), and fewer than ``occurrences_below`` earlier tool steps carry ``call_hash``. It
    returns the new step count, or no row when anything differs (or the lease is lost), and
    then changes nothing: statements guarded by that step count (``step_sql``) write nothing
    either, and the caller reads the run again."""
    assert limits.fingerprint is not None
    sql = (
        "UPDATE loops_looprun SET step_count = step_count + %s, "  # noqa: S608 (constants)
        f"updated_at = {db.now_sql()}, model_call_token = NULL "
        "WHERE id = %s AND lease_owner = %s AND lease_token = %s AND step_count = %s "
        "AND md5(COALESCE(policy_snapshot::text, '')) = %s "
        "AND md5(COALESCE((SELECT p.policy::text FROM loops_looppattern p "
        "WHERE p.id = loops_looprun.pattern_id), '')) = %s "
        "AND (SELECT COUNT(*) FROM loops_loopstep s WHERE s.run_id = loops_looprun.id "
        "AND s.call_hash = %s AND s.kind = 'tool') < %s "
        "RETURNING step_count"
    )
    params = [step_increment, lease.run_id, lease.owner, lease.token, steps_before]
    return sql, [*params, *limits.fingerprint, call_hash, occurrences_below]


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
    return limits_from_fence(lease, db.fetch_all(sql, params))


def run_limits(run_id: uuid.UUID, now: datetime | None = None) -> RunLimits:
    """Read a run's limits from the database (so a raise is seen at the next check)."""
    rows = db.fetch_all(
        f"SELECT {LIMIT_COLUMNS} FROM loops_looprun WHERE id = %s",  # noqa: S608 (constants)
        [db.uuid_param(run_id)],
    )
    if not rows:
        raise LoopRun.DoesNotExist(f"run {run_id} does not exist")
    pattern_id, snapshot, pattern_policy = rows[0]
    return limits_from_row(run_id, pattern_id, snapshot, pattern_policy, now)


# --- buckets -----------------------------------------------------------------------------------


def _ensure(scope: str, metrics: Iterable[str]) -> None:
    UsageBucket.objects.bulk_create(
        [UsageBucket(scope=scope, metric=m) for m in metrics], ignore_conflicts=True
    )


def usage(scope: str, metrics: Iterable[str]) -> dict[str, Decimal]:
    wanted = list(metrics)
    if not wanted:
        return {}
    rows = dict(
        UsageBucket.objects.filter(scope=scope, metric__in=wanted).values_list("metric", "value")
    )
    return {m: amount(rows.get(m) or 0) for m in wanted}


def _lock(scope: str, metrics: list[str]) -> dict[str, Decimal]:
    """Lock a scope's buckets (sorted by metric, the one order every writer uses)."""
    _ensure(scope, metrics)
    rows = UsageBucket.objects.select_for_update().filter(scope=scope, metric__in=metrics)
    values = dict(rows.order_by("metric").values_list("metric", "value"))
    return {m: amount(values.get(m) or 0) for m in metrics}


def _param(value: Decimal) -> Any:
    """A number for raw SQL: SQLite compares a text parameter (how Decimal is sent) as greater
    than any number, so it gets an int or a float."""
    if db.is_postgres():
        return value
    return int(value) if value == value.to_integral_value() else float(value)


def _upsert(scope: str, metric: str, n: Decimal, limit: Decimal | None) -> bool:
    """Add ``n`` to the bucket (created at ``n``), unless the sum would pass ``limit``.

    One ``INSERT … ON CONFLICT DO UPDATE … WHERE``: the database locks the existing row and
    judges the condition on its latest committed value, so parallel writers never overtake one
    another; the row count says whether it was applied.
    """
    if limit is not None and n > limit:
        return False
    guard = "" if limit is None else " WHERE loops_usagebucket.value + excluded.value <= %s"
    now = db.now_sql()
    sql = (
        "INSERT INTO loops_usagebucket (scope, metric, value, updated_at) "  # noqa: S608 (constants and placeholders only)
        f"VALUES (%s, %s, %s, {now}) ON CONFLICT (scope, metric) DO UPDATE SET "
        f"value = loops_usagebucket.value + excluded.value, updated_at = {now}{guard}"
    )
    params = [scope, metric, _param(n), *([] if limit is None else [_param(limit)])]
    return db.execute(sql, params) == 1


def _take(
    kind: str, scope: str, metric: str, n: Decimal, limit: Decimal | None
) -> Exhausted | None:
    """Add ``n`` unless that would pass ``limit``; else what the budget stands at."""
    if _upsert(scope, metric, n, limit):
        return None
    assert limit is not None
    return Exhausted(kind, scope, metric, usage(scope, [metric])[metric], limit)


def _add_many(rows: list[tuple[str, str, Decimal]]) -> None:
    """Add to several buckets whatever their limits, in one multi-row upsert (rows are taken
    in the given order, which must be the one order every writer uses: per-run scope first,
    then the day, metrics sorted)."""
    if not rows:
        return
    now = db.now_sql()
    values = ", ".join([f"(%s, %s, %s, {now})"] * len(rows))
    sql = (
        "INSERT INTO loops_usagebucket (scope, metric, value, updated_at) "  # noqa: S608 (constants and placeholders only)
        f"VALUES {values} ON CONFLICT (scope, metric) DO UPDATE SET "
        f"value = loops_usagebucket.value + excluded.value, updated_at = {now}"
    )
    db.execute(sql, [p for scope, metric, n in rows for p in (scope, metric, _param(n))])


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
            refused = _take(kind, scope, metric, amount(amounts[metric]), bounds.get(metric))
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
                raise Exhausted(kind, scope, metric, used, bounds[metric]).error()


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


# --- the engine's checkpoints ------------------------------------------------------------------

INVOCATION_STARTED = "invocation.started"


def budget_invocation_start(lease: Lease, *, role: str, invocation: str) -> bool:
    """Count an invocation (and a verification for the verifier) as it starts, once.

    Returns False for a resumed invocation (already counted). Raises :class:`BudgetExhausted`
    when a budget has no room for it, counting nothing.
    """
    return budget_invocation_begin(lease, role=role, invocation=invocation).started


@dataclass(frozen=True)
class InvocationStart:
    """:func:`budget_invocation_begin`'s answer: ``started`` False for a resumed invocation
    (already counted); ``metered`` whether a tokens or cost limit binds the run."""

    started: bool
    metered: bool
    #: The run's step count now: the lease holder's journal numbers its next steps from it.
    steps: int = 0
    #: The run's limits now (its journal decides from them which reads may run first).
    limits: RunLimits | None = None


@transaction.atomic
def budget_invocation_begin(lease: Lease, *, role: str, invocation: str) -> InvocationStart:
    """:func:`budget_invocation_start`, also saying whether model calls need admission."""
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
    amounts = {"invocations": 1, **({"verifications": 1} if role == "verifier" else {})}
    budget_take(limits, amounts)
    require_room(limits)
    return InvocationStart(started=True, metered=metered(limits), steps=steps, limits=limits)


def tool_call_amounts(name: str) -> dict[str, int]:
    return {"toolCalls": 1, **({"delegations": 1} if name in DELEGATION_TOOLS else {})}


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


def metered(limits: RunLimits) -> bool:
    """Does any tokens or cost limit bind the run (its own or its pattern's day)?"""
    return any(m in limits.per_run or m in limits.daily for m in METERED)


@dataclass(frozen=True)
class BudgetAdmission:
    """:func:`budget_admission`'s answer: ``wait`` None (admitted) or seconds to wait before
    asking again; ``metered`` whether a tokens or cost limit bound the run when asked."""

    wait: float | None
    metered: bool


def budget_admit_model_call(lease: Lease) -> float | None:
    """May the run's next model call start now? None: yes (admitted). A number: ask again
    after that many seconds (another run's call is in flight near a shared limit). Raises
    :class:`BudgetExhausted` when a tokens or cost budget is used up."""
    return budget_admission(lease).wait


@transaction.atomic
def budget_admission(lease: Lease) -> BudgetAdmission:
    """:func:`budget_admit_model_call`, also saying whether any metered limit binds the run.

    A run bound by none needs no admission (nothing can be used up, nothing is shared): the
    engine's journal then skips asking before each model call, re-asking at least every
    ``ADMISSION_RECHECK_SECONDS`` (a daily limit may be added to the pattern meanwhile; the
    run's own limits can only be raised or removed)."""
    _, _, limits = fenced_limits(lease)
    wait = _admit(lease, limits)
    return BudgetAdmission(wait=wait, metered=metered(limits))


#: How long a journal may go without asking for admission when no metered limit binds it.
ADMISSION_RECHECK_SECONDS = 1.0


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


# --- trigger refusal and operator raises ------------------------------------------------------


def daily_exhaustion(pattern: LoopPattern, now: datetime | None = None) -> Exhausted | None:
    """The first daily budget of the pattern that is used up today, if any."""
    policy = _policy(pattern.policy)
    if policy is None:
        return None
    bounds = limits_of(policy.budgets.daily)
    scope = daily_scope(pattern.pk, now or timezone.now())
    for metric, used in usage(scope, sorted(bounds)).items():
        if used >= bounds[metric]:
            return Exhausted(DAILY, scope, metric, used, bounds[metric])
    return None


def spent_message(spent: Exhausted, now: datetime) -> str:
    return f"{spent.reason}; it resets at {iso(next_reset(now))}"


def daily_budget_refusal(pattern: LoopPattern, now: datetime | None = None) -> str | None:
    """Why the pattern refuses new runs because of its daily budget, or None."""
    now = now or timezone.now()
    spent = daily_exhaustion(pattern, now)
    return spent_message(spent, now) if spent else None


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _raise_problem(metric: str, old: Any, new: Any) -> str | None:
    """Why setting ``metric`` from ``old`` to ``new`` (None: no limit) is not a raise."""
    if old is None and new is not None:
        return f"{metric} has no per-run limit on this run; {new} would lower it"
    if old is not None and new is not None and new < old:
        return f"{metric} is limited to {old} on this run; {new} would lower it"
    return None


def _raised_limits(current: Budget, raised: Budget) -> dict[str, dict[str, Any]]:
    """metric → {from, to} for every metric the request sets (``to`` None: no limit any
    more); refuses any lowering, naming every offending metric."""
    changes: dict[str, dict[str, Any]] = {}
    errors = []
    for metric in sorted(raised.model_fields_set):
        old, new = getattr(current, metric), getattr(raised, metric)
        problem = _raise_problem(metric, old, new)
        if problem:
            errors.append({"pointer": f"/perRun/{metric}", "detail": problem, "code": "lower"})
        else:
            changes[metric] = {"from": old, "to": new}
    if errors:
        raise InvalidInput(f"Budgets can only be raised: {errors[0]['detail']}.", errors=errors)
    return changes


def _parse_budget(data: Any) -> Budget:
    try:
        return Budget.model_validate(data)
    except ValidationError as exc:
        errors = pydantic_errors(exc, "/perRun")
        raise InvalidInput(f"The budget is invalid: {errors[0]['detail']}", errors=errors) from exc


@transaction.atomic
def run_budget_raise(*, run_id: uuid.UUID, per_run: Any, actor: str) -> LoopRun:
    """Raise limits of the run's own budget (merged into its ``policy_snapshot``).

    Only raising is allowed: every given metric gets a limit at least as high as the run's, or
    ``null`` for no limit (to hold a run back, pause or cancel it instead). A run that is still
    going sees the new limits at its next check; a blocked run continues after ``resume``.
    Daily limits belong to the pattern: raise them by updating the pattern's policy.
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

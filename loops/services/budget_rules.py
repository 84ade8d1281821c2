"""The pure half of budgets: metrics, limits, the arithmetic of usage against them and the
admission rule for a shared metered budget. No database and no Django here (the statements are
in ``budget_sql``, the services that run them in ``budgets``)."""

from __future__ import annotations

import functools
import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from loops.policy import Budget, PatternPolicy, ToolLoopPolicy
from loops.services.harness_limits import HarnessBound
from runtime.invocation import BudgetExhausted, RunHalted

COUNTED = ("invocations", "toolCalls", "verifications")

METERED = ("tokens", "cost")

METRICS = (*COUNTED, *METERED)

PER_RUN, DAILY = "perRun", "daily"


#: A parallel model call is admitted only while the headroom covers this many times the
#: largest call charged today for every call in flight (calls grow as conversations do).
PARALLEL_MARGIN = 2

#: How long a model call waits before asking again for admission on a shared budget.
ADMISSION_RETRY_SECONDS = 0.2

#: How long a journal may go without asking for admission when no metered limit binds it,
#: counted from the latest admission or write that read the run's limits or proved them unchanged.
ADMISSION_RECHECK_SECONDS = 1.0

_QUANTUM = Decimal("0.000001")

INVOCATION_STARTED = "invocation.started"


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


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def spent_message(spent: Exhausted, now: datetime) -> str:
    return f"{spent.reason}; it resets at {iso(next_reset(now))}"


@dataclass(frozen=True)
class Exhausted:
    """A budget without room: which one, and how far it was used."""

    kind: str
    scope: str
    metric: str
    used: Decimal
    limit: Decimal
    #: The harness setting that decided this per-run limit (the run then fails, not blocks).
    bound: HarnessBound | None = None

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

    def error(self) -> RunHalted:
        if self.bound is not None:
            return self.bound.reached(self.metric, self.used)
        return BudgetExhausted(self.reason, code=self.code, data=self.data())


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
    #: (None when they came decoded): ``budget_sql.fence_unchanged_sql`` proves them unchanged.
    fingerprint: tuple[str, str] | None = None
    #: Per-run metrics whose limit a harness setting decided (``harness_limits.tightened``).
    harness: Mapping[str, HarnessBound] = field(default_factory=dict, compare=False)

    def bound(self, kind: str, metric: str) -> HarnessBound | None:
        """The harness setting behind the ``kind`` limit of ``metric``, if one decided it."""
        return self.harness.get(metric) if kind == PER_RUN else None

    def sections(self) -> list[tuple[str, str, dict[str, Decimal]]]:
        """(kind, scope, limits), per-run first: the order buckets are always touched in."""
        return [(PER_RUN, run_scope(self.run_id), self.per_run), (DAILY, self.day, self.daily)]


def metered(limits: RunLimits) -> bool:
    """Does any tokens or cost limit bind the run (its own or its pattern's day)?"""
    return any(m in limits.per_run or m in limits.daily for m in METERED)


#: What a tool call's start counts.
TOOL_CALL_AMOUNTS: dict[str, int] = {"toolCalls": 1}


def invocation_amounts(role: str) -> dict[str, int]:
    """What an invocation's start counts: an invocation, and a verification for the verifier."""
    return {"invocations": 1, **({"verifications": 1} if role == "verifier" else {})}


@dataclass(frozen=True)
class InvocationStart:
    """``budgets.budget_invocation_begin``'s answer: ``started`` False for a resumed invocation
    (already counted); ``metered`` whether a tokens or cost limit binds the run."""

    started: bool
    metered: bool
    #: The run's step count now: the lease holder's journal numbers its next steps from it.
    steps: int = 0
    #: The run's limits now (its journal decides from them which reads may run first).
    limits: RunLimits | None = None


@dataclass(frozen=True)
class BudgetAdmission:
    """``budgets.budget_admission``'s answer: ``wait`` None (admitted) or seconds to wait before
    asking again; ``metered`` whether a tokens or cost limit bound the run when asked."""

    wait: float | None
    metered: bool


def policy_of(data: Any) -> PatternPolicy | None:
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
    pinned = policy_of(json.loads(snapshot) if snapshot else {}) or PatternPolicy()
    # The day's budget is the pattern's as it stands now; a stored policy that no longer
    # parses (it was validated when saved) falls back to what the run pinned.
    current = (policy_of(json.loads(pattern_policy)) if pattern_policy else None) or pinned
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
        day=daily_scope(int(pattern_id), now or datetime.now(UTC)),
        fingerprint=parsed.fingerprint if as_stored else None,
    )


def raise_problem(metric: str, old: Any, new: Any) -> str | None:
    """Why setting ``metric`` from ``old`` to ``new`` (None: no limit) is not a raise."""
    if old is None and new is not None:
        return f"{metric} has no per-run limit on this run; {new} would lower it"
    if old is not None and new is not None and new < old:
        return f"{metric} is limited to {old} on this run; {new} would lower it"
    return None

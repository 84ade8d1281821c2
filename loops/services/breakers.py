"""The pattern circuit breaker: consecutive failed runs stop a pattern's triggers for a while.

One ``CircuitState`` row per pattern (key ``pattern:<pattern key>``), shared by every process:

* ``closed``: triggers are accepted. Each failed run adds one to ``consecutive_failures``; a
  succeeded run resets it to 0. At ``circuitBreaker.failureThreshold`` (default 5) the breaker
  *trips*: ``open`` with the pattern's ``cooldownSeconds``.
* ``open``: triggers are refused (``run_trigger`` raises a 409 naming the breaker and
  ``breaker_open_until``) until the cooldown has passed since ``opened_at``. The first trigger
  after that starts the single *probe* run and the breaker goes ``half_open``.
* ``half_open``: the probe is in flight; other triggers are refused. The probe succeeding closes
  the breaker (count 0, base cooldown); failing re-opens it with the cooldown doubled, up to
  ``COOLDOWN_CAP_FACTOR`` times the pattern's cooldown and never past a day. A canceled probe
  decides nothing: the breaker is open again with its cooldown already over, so the next
  trigger probes.

Any run's success closes the breaker (it shows the pattern works); canceled runs count neither
way. Outcomes are recorded by the run's end (:mod:`loops.services.endings`) in the transaction
that ends the run, so no failure is lost or counted twice. Decisions are pure functions of a
:class:`Breaker` and ``now`` (tests inject the clock); the database layer locks the row around
them.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from django.utils import timezone

from loops.models import CircuitState, LoopPattern, RunStatus
from loops.policy import CircuitBreakerPolicy, PatternPolicy
from orchestrator.errors import Conflict
from orchestrator.sql import fetch_one_prepared

COOLDOWN_CAP_FACTOR = 16
MAX_COOLDOWN_SECONDS = 86_400


class State(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Outcome(enum.StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    NEUTRAL = "neutral"


def outcome_of(status: str) -> Outcome:
    if status == RunStatus.SUCCEEDED:
        return Outcome.SUCCESS
    if status == RunStatus.FAILED:
        return Outcome.FAILURE
    return Outcome.NEUTRAL


def key_of(pattern_key: str) -> str:
    return f"pattern:{pattern_key}"


def cooldown_cap(base: int) -> int:
    return max(base, min(base * COOLDOWN_CAP_FACTOR, MAX_COOLDOWN_SECONDS))


@dataclass(frozen=True)
class Breaker:
    """One pattern breaker's state (what a ``CircuitState`` row holds)."""

    state: State = State.CLOSED
    failures: int = 0
    opened_at: datetime | None = None
    cooldown: int = 300
    #: The probe run while half-open (its id), else "".
    probe: str = ""

    @property
    def open_until(self) -> datetime | None:
        if self.state != State.OPEN or self.opened_at is None:
            return None
        return self.opened_at + timedelta(seconds=self.cooldown)


@dataclass(frozen=True)
class BreakerAdmission:
    """Whether a trigger may start a run now: refused (``refusal``), a probe, or plain."""

    refusal: str = ""
    probe: bool = False
    open_until: datetime | None = None

    @property
    def allowed(self) -> bool:
        return not self.refusal


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def admit(breaker: Breaker, now: datetime) -> BreakerAdmission:
    """May a trigger start a run now? (pure)"""
    if breaker.state == State.CLOSED:
        return BreakerAdmission()
    if breaker.state == State.HALF_OPEN:
        return BreakerAdmission(
            refusal=(
                f"circuit breaker half-open after {breaker.failures} consecutive failed runs: "
                f"probe run {breaker.probe} decides whether the pattern works again; retry "
                "after it finishes"
            )
        )
    until = breaker.open_until or now
    if now < until:
        return BreakerAdmission(
            refusal=(
                f"circuit breaker open after {breaker.failures} consecutive failed runs; "
                f"retry after {iso(until)}"
            ),
            open_until=until,
        )
    return BreakerAdmission(probe=True)


def start_probe(breaker: Breaker, run_id: str) -> Breaker:
    return replace(breaker, state=State.HALF_OPEN, probe=run_id)


def record(
    breaker: Breaker, *, outcome: Outcome, run_id: str, policy: CircuitBreakerPolicy, now: datetime
) -> Breaker:
    """The breaker after a run of the pattern ended with ``outcome`` (pure)."""
    is_probe = breaker.state == State.HALF_OPEN and breaker.probe == run_id
    if outcome == Outcome.SUCCESS:
        return Breaker(cooldown=policy.cooldownSeconds)
    if outcome == Outcome.NEUTRAL:
        # A canceled probe proves nothing: open again, cooldown over, so the next trigger probes.
        return replace(breaker, state=State.OPEN, probe="") if is_probe else breaker
    failures = breaker.failures + 1
    if is_probe:
        cooldown = min(breaker.cooldown * 2, cooldown_cap(policy.cooldownSeconds))
        return Breaker(State.OPEN, failures, now, cooldown)
    if breaker.state == State.CLOSED and failures >= policy.failureThreshold:
        return Breaker(State.OPEN, failures, now, policy.cooldownSeconds)
    return replace(breaker, failures=failures)


# --- the database ------------------------------------------------------------------------------


def _state_of(value: str) -> State:
    """A stored state (an unknown value reads as closed)."""
    try:
        return State(value)
    except ValueError:
        return State.CLOSED


def _from_row(row: CircuitState) -> Breaker:
    return Breaker(
        _state_of(row.state),
        row.consecutive_failures,
        row.opened_at,
        row.cooldown_seconds,
        row.probe_owner,
    )


#: The state of one breaker row, by key (a pattern never tripped has none: closed).
_STATE_SQL = f"SELECT state FROM {CircuitState._meta.db_table} WHERE key = %s"  # noqa: S608


def _closed(pattern: LoopPattern) -> bool:
    """Is the pattern's breaker closed? Its state column alone, read without the ORM."""
    row = fetch_one_prepared("lw_breaker_state", _STATE_SQL, [key_of(pattern.key)])
    return row is None or _state_of(str(row[0])) == State.CLOSED


def _save(row: CircuitState, breaker: Breaker) -> None:
    row.state, row.consecutive_failures = breaker.state.value, breaker.failures
    row.opened_at, row.cooldown_seconds = breaker.opened_at, breaker.cooldown
    row.probe_owner = breaker.probe
    row.save(
        update_fields=[
            "state",
            "consecutive_failures",
            "opened_at",
            "cooldown_seconds",
            "probe_owner",
            "updated_at",
        ]
    )


def _locked(pattern: LoopPattern, policy: CircuitBreakerPolicy) -> CircuitState:
    row, _ = CircuitState.objects.select_for_update().get_or_create(
        key=key_of(pattern.key), defaults={"cooldown_seconds": policy.cooldownSeconds}
    )
    return row


def _breaker_policy(pattern: LoopPattern) -> CircuitBreakerPolicy:
    try:
        return PatternPolicy.model_validate(pattern.policy or {}).circuitBreaker
    except ValueError:
        return CircuitBreakerPolicy()


def breaker_read(pattern: LoopPattern) -> Breaker:
    row = CircuitState.objects.filter(key=key_of(pattern.key)).first()
    return _from_row(row) if row else Breaker(cooldown=_breaker_policy(pattern).cooldownSeconds)


def breaker_refusal(pattern: LoopPattern, now: datetime | None = None) -> str | None:
    """Why the breaker refuses a trigger now (read only; a due probe is not refused)."""
    admission = admit(breaker_read(pattern), now or timezone.now())
    return admission.refusal or None


def breaker_admit_trigger(pattern: LoopPattern, now: datetime | None = None) -> bool:
    """Lock the pattern's breaker for the caller's transaction and refuse with a 409 when it
    is open; returns True when the run about to start is the half-open probe (the caller then
    calls :func:`breaker_start_probe` with its id in the same transaction).

    A closed breaker is only read: triggers of a healthy pattern neither write nor wait."""
    if _closed(pattern):
        return False
    row = _locked(pattern, _breaker_policy(pattern))
    admission = admit(_from_row(row), now or timezone.now())
    if not admission.allowed:
        until = admission.open_until
        raise Conflict(
            f"Pattern {pattern.key!r} refuses new runs: {admission.refusal}.",
            breaker_state=row.state,
            breaker_open_until=iso(until) if until else None,
            consecutive_failures=row.consecutive_failures,
        )
    return admission.probe


def breaker_start_probe(pattern: LoopPattern, run_id: uuid.UUID) -> None:
    row = _locked(pattern, _breaker_policy(pattern))
    _save(row, start_probe(_from_row(row), str(run_id)))


def records_nothing(breaker: Breaker, outcome: Outcome, run_id: str) -> bool:
    """Whether counting ``outcome`` leaves ``breaker`` as it is, known without a lock: a success
    while it is closed with no failures, and an end that is neither a success nor a failure of
    a run that is not its probe. ``transitions._ENDS_CLEANLY`` states the same rule in SQL."""
    if outcome == Outcome.SUCCESS:
        return breaker.state == State.CLOSED and not breaker.failures
    return outcome == Outcome.NEUTRAL and breaker.probe != run_id


def breaker_record_outcome(*, pattern_id: int, run_id: uuid.UUID, status: str) -> Breaker | None:
    """Count a run that just ended (call in the transaction that ends it).

    Returns the breaker when it changed state (tripped, re-opened, closed), else None; writes
    nothing when :func:`records_nothing` says so.
    """
    outcome = outcome_of(status)
    pattern = LoopPattern.objects.get(pk=pattern_id)
    if records_nothing(breaker_read(pattern), outcome, str(run_id)):
        return None
    policy = _breaker_policy(pattern)
    row = _locked(pattern, policy)
    before = _from_row(row)
    after = record(before, outcome=outcome, run_id=str(run_id), policy=policy, now=timezone.now())
    if after != before:
        _save(row, after)
    return after if after.state != before.state else None


def breaker_summary(breaker: Breaker) -> dict[str, object]:
    """The breaker as an event shows it."""
    until = breaker.open_until
    return {
        "state": breaker.state.value,
        "consecutive_failures": breaker.failures,
        "open_until": iso(until) if until else None,
        "cooldown_seconds": breaker.cooldown,
    }

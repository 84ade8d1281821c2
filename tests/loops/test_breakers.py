"""The pattern circuit breaker: the state machine (pure, with an injected clock), and the
database wiring (run outcomes counted as runs end, triggers refused while open, the half-open
probe), with the clock moved by rewriting ``opened_at``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from rest_framework.test import APIClient

from loops.models import CircuitState, LoopEvent, LoopPattern, LoopRun, RunStatus
from loops.policy import CircuitBreakerPolicy
from loops.services import breakers
from loops.services.breakers import Breaker, Outcome, State, admit, record
from loops.services.endings import run_transition
from loops.services.runs import run_act, run_retry, run_trigger
from loops.triggers.guards import trigger_refusal
from orchestrator.errors import Conflict
from tests.support.factories import make_pattern

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
POLICY = CircuitBreakerPolicy(failureThreshold=3, cooldownSeconds=60)


def after(breaker: Breaker, *outcomes: Outcome, run_id: str = "r", now: datetime = T0) -> Breaker:
    for outcome in outcomes:
        breaker = record(breaker, outcome=outcome, run_id=run_id, policy=POLICY, now=now)
    return breaker


F, S, N = Outcome.FAILURE, Outcome.SUCCESS, Outcome.NEUTRAL


# --- the state machine ---------------------------------------------------------------------


def test_failures_below_the_threshold_keep_the_breaker_closed() -> None:
    breaker = after(Breaker(), F, F)
    assert (breaker.state, breaker.failures) == (State.CLOSED, 2)
    assert admit(breaker, T0).allowed


def test_the_threshold_trips_it_open_for_the_cooldown() -> None:
    breaker = after(Breaker(), F, F, F)
    assert (breaker.state, breaker.failures, breaker.cooldown) == (State.OPEN, 3, 60)
    assert breaker.open_until == T0 + timedelta(seconds=60)
    refused = admit(breaker, T0 + timedelta(seconds=59))
    assert not refused.allowed and refused.open_until == T0 + timedelta(seconds=60)
    assert refused.refusal == (
        "circuit breaker open after 3 consecutive failed runs; retry after 2026-03-01T12:01:00Z"
    )


def test_a_success_resets_the_count_of_consecutive_failures() -> None:
    breaker = after(Breaker(), F, F, S, F, F)
    assert (breaker.state, breaker.failures) == (State.CLOSED, 2)


def test_canceled_runs_count_neither_way() -> None:
    assert after(Breaker(), F, N, F, N) == after(Breaker(), F, F)


def test_after_the_cooldown_one_trigger_becomes_the_probe() -> None:
    breaker = after(Breaker(), F, F, F)
    admission = admit(breaker, T0 + timedelta(seconds=60))
    assert admission.allowed and admission.probe
    probing = breakers.start_probe(breaker, "probe-run")
    assert probing.state == State.HALF_OPEN
    refused = admit(probing, T0 + timedelta(hours=1))
    assert not refused.allowed and "probe run probe-run" in refused.refusal


def test_the_probe_succeeding_closes_the_breaker() -> None:
    probing = breakers.start_probe(after(Breaker(), F, F, F), "p")
    closed = after(probing, S, run_id="p")
    assert closed == Breaker(cooldown=60)


def test_the_probe_failing_reopens_it_with_the_cooldown_doubled_up_to_a_cap() -> None:
    breaker = after(Breaker(), F, F, F)
    cooldowns = []
    for hour in range(8):
        later = T0 + timedelta(hours=hour)
        breaker = after(breakers.start_probe(breaker, "p"), F, run_id="p", now=later)
        assert breaker.state == State.OPEN and breaker.opened_at == later
        cooldowns.append(breaker.cooldown)
    assert cooldowns == [120, 240, 480, 960, 960, 960, 960, 960]  # 16 x 60 s at most
    assert breakers.cooldown_cap(3_600) == 57_600 and breakers.cooldown_cap(7_200) == 86_400


def test_a_canceled_probe_lets_the_next_trigger_probe_at_once() -> None:
    probing = breakers.start_probe(after(Breaker(), F, F, F), "p")
    released = after(probing, N, run_id="p", now=T0 + timedelta(hours=1))
    assert released.state == State.OPEN and not released.probe
    assert admit(released, T0 + timedelta(hours=1)).probe


def test_other_runs_failing_while_a_probe_runs_only_add_to_the_count() -> None:
    probing = breakers.start_probe(after(Breaker(), F, F, F), "p")
    still = after(probing, F, run_id="other")
    assert (still.state, still.failures, still.probe) == (State.HALF_OPEN, 4, "p")


# --- the database wiring --------------------------------------------------------------------


def breaker_pattern(threshold: int = 3, cooldown: int = 60) -> LoopPattern:
    return make_pattern(
        policy={"circuitBreaker": {"failureThreshold": threshold, "cooldownSeconds": cooldown}}
    )


def end(run: LoopRun, status: RunStatus) -> None:
    """Take a queued run to ``status`` the way a worker would (preparing, running, the end)."""
    for step in (RunStatus.PREPARING, RunStatus.RUNNING, status):
        run_transition(run_id=run.id, to=step, actor="t", event_type="t.end")


def start(pattern: LoopPattern) -> LoopRun:
    return run_trigger(pattern=pattern, actor="op")


def state_of(pattern: LoopPattern) -> CircuitState:
    return CircuitState.objects.get(key=f"pattern:{pattern.key}")


def cool_down(pattern: LoopPattern) -> None:
    """Move the breaker's clock: it opened long enough ago for the cooldown to be over."""
    row = state_of(pattern)
    assert row.opened_at is not None
    row.opened_at -= timedelta(seconds=row.cooldown_seconds + 1)
    row.save(update_fields=["opened_at"])


def trip(pattern: LoopPattern, failures: int = 3) -> None:
    for _ in range(failures):
        end(start(pattern), RunStatus.FAILED)


@pytest.mark.django_db
def test_consecutive_failed_runs_trip_the_breaker_and_triggers_are_refused() -> None:
    pattern = breaker_pattern()
    runs = [start(pattern) for _ in range(3)]
    for run in runs[:2]:
        end(run, RunStatus.FAILED)
    assert state_of(pattern).state == "closed" and trigger_refusal(pattern) is None
    end(runs[2], RunStatus.FAILED)
    row = state_of(pattern)
    assert (row.state, row.consecutive_failures, row.cooldown_seconds) == ("open", 3, 60)
    tripping = LoopEvent.objects.get(run=runs[2], to_status="failed")
    assert tripping.data["breaker"]["state"] == "open"
    with pytest.raises(Conflict) as refused:
        start(pattern)
    assert "circuit breaker open after 3 consecutive failed runs; retry after" in str(
        refused.value.detail
    )
    until = refused.value.extra["breaker_open_until"]
    assert until == (row.opened_at + timedelta(seconds=60)).astimezone(UTC).isoformat().replace(
        "+00:00", "Z"
    )
    assert refused.value.extra["breaker_state"] == "open"
    refusal = trigger_refusal(pattern)
    assert refusal is not None and refusal.startswith("circuit breaker open after 3")
    with pytest.raises(Conflict):  # a retry is a trigger too
        run_retry(run_id=runs[0].id, actor="op")
    assert LoopRun.objects.filter(pattern=pattern).count() == 3


@pytest.mark.django_db
def test_a_success_between_failures_keeps_the_breaker_closed() -> None:
    pattern = breaker_pattern()
    trip(pattern, 2)
    end(start(pattern), RunStatus.SUCCEEDED)
    trip(pattern, 2)
    row = state_of(pattern)
    assert (row.state, row.consecutive_failures) == ("closed", 2)


@pytest.mark.django_db
def test_after_the_cooldown_the_next_trigger_is_the_single_probe() -> None:
    pattern = breaker_pattern()
    trip(pattern)
    cool_down(pattern)
    assert trigger_refusal(pattern) is None  # a probe is due: not a refusal
    probe = start(pattern)
    row = state_of(pattern)
    assert (row.state, row.probe_owner) == ("half_open", str(probe.id))
    assert LoopEvent.objects.filter(run=probe, type="breaker.probe").exists()
    with pytest.raises(Conflict) as refused:
        start(pattern)
    assert f"probe run {probe.id}" in refused.value.detail
    assert refused.value.extra["breaker_open_until"] is None


@pytest.mark.django_db
def test_the_probe_succeeding_closes_the_breaker_for_good() -> None:
    pattern = breaker_pattern()
    trip(pattern)
    cool_down(pattern)
    end(start(pattern), RunStatus.SUCCEEDED)
    row = state_of(pattern)
    assert (row.state, row.consecutive_failures, row.probe_owner) == ("closed", 0, "")
    start(pattern)
    start(pattern)


@pytest.mark.django_db
def test_the_probe_failing_reopens_the_breaker_for_twice_as_long() -> None:
    pattern = breaker_pattern()
    trip(pattern)
    cool_down(pattern)
    end(start(pattern), RunStatus.FAILED)
    row = state_of(pattern)
    assert (row.state, row.cooldown_seconds, row.consecutive_failures) == ("open", 120, 4)
    assert row.opened_at is not None and datetime.now(UTC) - row.opened_at < timedelta(seconds=5)
    with pytest.raises(Conflict, match="after 4 consecutive failed runs"):
        start(pattern)


@pytest.mark.django_db
def test_canceling_the_probe_lets_the_next_trigger_probe() -> None:
    pattern = breaker_pattern()
    trip(pattern)
    cool_down(pattern)
    probe = start(pattern)
    run_act(run_id=probe.id, action="cancel", actor="op")
    assert state_of(pattern).state == "open"
    second = start(pattern)
    assert state_of(pattern).probe_owner == str(second.id)


@pytest.mark.django_db
def test_the_threshold_and_cooldown_come_from_the_pattern_policy() -> None:
    pattern = breaker_pattern(threshold=5, cooldown=30)
    trip(pattern, 4)
    assert state_of(pattern).state == "closed"
    trip(pattern, 1)
    assert (state_of(pattern).state, state_of(pattern).cooldown_seconds) == ("open", 30)
    default = make_pattern()
    trip(default, 4)
    assert state_of(default).state == "closed"  # default threshold: 5
    end(start(default), RunStatus.FAILED)
    assert state_of(default).state == "open"


@pytest.mark.django_db
def test_succeeding_runs_of_a_healthy_pattern_write_no_breaker_row() -> None:
    pattern = breaker_pattern()
    end(start(pattern), RunStatus.SUCCEEDED)
    assert not CircuitState.objects.filter(key=f"pattern:{pattern.key}").exists()


@pytest.mark.django_db
def test_the_trigger_endpoint_answers_409_naming_the_breaker(
    api_client_for: Callable[[str], APIClient],
) -> None:
    pattern = breaker_pattern()
    trip(pattern)
    response = api_client_for("operator").post(
        f"/api/v1/patterns/{pattern.key}/trigger", {}, format="json"
    )
    assert response.status_code == 409
    body = response.json()
    assert "circuit breaker open after 3 consecutive failed runs" in body["detail"]
    assert body["breaker_open_until"].endswith("Z")
    assert body["consecutive_failures"] == 3

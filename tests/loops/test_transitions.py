from __future__ import annotations

import pytest

from loops import state
from loops.models import LoopEvent, LoopRun, RunStatus
from loops.services.endings import run_transition
from loops.services.transitions import Lease
from loops.state import TransitionRefused
from runtime.invocation import LeaseLost
from tests.support.factories import make_run

ALLOWED = [(src, dst) for src, targets in state.TRANSITIONS.items() for dst in sorted(targets)]
FORBIDDEN = [
    (src, dst)
    for src in RunStatus
    for dst in RunStatus
    if dst not in state.TRANSITIONS[src] and src != dst
]


@pytest.mark.django_db
@pytest.mark.parametrize(("src", "dst"), ALLOWED, ids=[f"{a}->{b}" for a, b in ALLOWED])
def test_every_allowed_transition_is_applied_and_recorded(src: RunStatus, dst: RunStatus) -> None:
    run = make_run(status=src)
    result = run_transition(run_id=run.id, to=dst, actor="tester")
    run.refresh_from_db()
    assert run.status == dst
    event = LoopEvent.objects.get(run=run, seq=result.seq)
    assert (event.from_status, event.to_status, event.actor) == (src, dst, "tester")
    assert run.event_seq == result.seq == 2
    if dst in state.TERMINAL:
        assert run.finished_at is not None


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("src", "dst"), FORBIDDEN[::7], ids=[f"{a}->{b}" for a, b in FORBIDDEN[::7]]
)
def test_forbidden_transitions_are_refused_naming_the_current_state(
    src: RunStatus, dst: RunStatus
) -> None:
    run = make_run(status=src)
    with pytest.raises(TransitionRefused) as refused:
        run_transition(run_id=run.id, to=dst, actor="tester")
    assert refused.value.current == src
    assert f"'{src}'" in str(refused.value)
    run.refresh_from_db()
    assert run.status == src
    assert LoopEvent.objects.filter(run=run).count() == 1


def test_terminal_states_have_no_way_out() -> None:
    for terminal in state.TERMINAL:
        assert state.TRANSITIONS[terminal] == frozenset()


@pytest.mark.django_db
def test_a_stale_lease_holder_cannot_transition_the_run() -> None:
    run = make_run(
        status=RunStatus.RUNNING, lease_owner="w1", lease_token=7, lease_expires_at=run_expiry()
    )
    with pytest.raises(LeaseLost):
        run_transition(
            run_id=run.id, to=RunStatus.VERIFYING, actor="w1", lease=Lease(run.id, "w1", 6)
        )
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING


@pytest.mark.django_db
def test_taking_a_run_away_from_its_worker_bumps_the_fencing_token() -> None:
    run = make_run(
        status=RunStatus.RUNNING, lease_owner="w1", lease_token=3, lease_expires_at=run_expiry()
    )
    run_transition(run_id=run.id, to=RunStatus.PAUSED, actor="operator")
    run = LoopRun.objects.get(pk=run.id)
    assert run.lease_owner is None and run.lease_expires_at is None
    assert run.lease_token == 4


def run_expiry():  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from django.utils import timezone

    return timezone.now() + timedelta(seconds=60)

"""A lock wait is recorded once: one ``lock.waiting`` when it starts, one ``wait.ended`` when it
ends (locks taken, timeout, cancel), polls in between only update the run's wait record; a
claim within a wait writes no ``lease.claimed``. Real claims (``run_claim``) and the real
engine (``drive_run`` with an invoker that finishes each role at once) on both write paths; the
worker's clock is moved by time-machine, and a 0 s lock retry makes each poll due at once."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from frontend.templatetags.waits import lock_text
from loops.models import LoopEvent, LoopRun, PathLock, RunStatus
from loops.services.claims import run_claim
from loops.services.claims_failures import run_driver_error
from loops.services.endings import run_transition
from loops.services.runs import run_act
from loops.worker.engine import _load_and_prepare
from orchestrator.cli_output import _wait_line
from tests.support.factories import make_run
from tests.support.lock_waits import REPO, held_and_waiting, poll
from tests.support.write_paths import both_write_paths


@pytest.fixture(autouse=True)
def _lock_retry_at_once(settings: Any) -> None:
    settings.LOOPWRIGHT = {**settings.LOOPWRIGHT, "LOCK_RETRY_SECONDS": 0.0}


def types(run: LoopRun) -> list[str]:
    return list(LoopEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True))


def seqs_are_dense(run: LoopRun) -> None:
    run.refresh_from_db()
    seqs = list(LoopEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, run.event_seq + 1))


def now() -> datetime:
    return timezone.now().replace(microsecond=0)


@both_write_paths
def test_a_four_minute_lock_wait_adds_at_most_four_events() -> None:
    holder, waiter = held_and_waiting()
    start = now()
    gaps = [2.0] * 119
    gaps[60] = 2.5  # one slower poll: the longest gap
    at = start
    assert poll(waiter, at) == RunStatus.WAITING_LOCK
    for gap in gaps:
        at += timedelta(seconds=gap)
        assert poll(waiter, at) == RunStatus.WAITING_LOCK
    waiter.refresh_from_db()
    assert (waiter.wait["kind"], waiter.wait["polls"]) == ("lock", 120)
    assert waiter.wait["detail"]["paths"] == ["src/app.py"]
    assert waiter.wait["detail"]["held_by"] == [str(holder.id)]
    assert types(waiter) == ["run.created", "lease.claimed", "lock.waiting"]

    run_transition(run_id=holder.id, to=RunStatus.CANCELED, actor="op")  # frees src
    at += timedelta(seconds=2)  # 4 min 2.5 s after the first poll
    assert poll(waiter, at) == RunStatus.SUCCEEDED

    events = types(waiter)
    started = events.index("run.started")
    assert events[: started + 1] == [
        "run.created",
        "lease.claimed",
        "lock.waiting",
        "wait.ended",
        "run.started",
    ]
    ended = LoopEvent.objects.get(run=waiter, type="wait.ended")
    assert ended.data["kind"] == "lock" and ended.data["polls"] == 120
    assert ended.data["waited_seconds"] == pytest.approx(240.5)
    assert ended.data["longest_gap_seconds"] == pytest.approx(2.5)
    assert ended.data["ended_by"] == "run.started"
    assert ended.data["detail"]["held_by"] == [str(holder.id)]
    waiting = LoopEvent.objects.get(run=waiter, type="lock.waiting")
    assert waiting.data["paths"] == ["src/app.py"] and waiting.data["held_by"] == [str(holder.id)]
    waiter.refresh_from_db()
    assert waiter.wait == {} and not PathLock.objects.filter(run=waiter).exists()
    seqs_are_dense(waiter)


@both_write_paths
def test_the_lock_wait_timeout_fires_from_the_wait_record() -> None:
    _, waiter = held_and_waiting(lockWaitTimeoutSeconds=60)
    start = now()
    for offset in (0, 20, 40, 60):
        assert poll(waiter, start + timedelta(seconds=offset)) == RunStatus.WAITING_LOCK
    assert poll(waiter, start + timedelta(seconds=61)) == RunStatus.FAILED
    waiter.refresh_from_db()
    assert waiter.terminal_reason == "lock_wait_timeout" and waiter.wait == {}
    assert types(waiter) == [
        "run.created",
        "lease.claimed",
        "lock.waiting",
        "wait.ended",
        "lock.timeout",
    ]
    ended = LoopEvent.objects.get(run=waiter, type="wait.ended")
    assert (ended.data["polls"], ended.data["ended_by"], ended.data["to"]) == (
        4,
        "lock.timeout",
        "failed",
    )
    assert ended.data["waited_seconds"] == pytest.approx(61)
    seqs_are_dense(waiter)


@both_write_paths
def test_cancelling_a_waiting_run_ends_its_wait_in_the_same_transaction() -> None:
    _, waiter = held_and_waiting()
    start = now()
    for offset in (0, 2, 4):
        poll(waiter, start + timedelta(seconds=offset))
    run_act(run_id=waiter.id, action="cancel", actor="operator", reason="enough")
    waiter.refresh_from_db()
    assert waiter.status == RunStatus.CANCELED and waiter.wait == {}
    assert types(waiter)[-3:] == ["lock.waiting", "wait.ended", "run.canceled"]
    ended = LoopEvent.objects.get(run=waiter, type="wait.ended")
    assert (ended.data["polls"], ended.data["ended_by"], ended.actor) == (
        3,
        "run.canceled",
        "operator",
    )
    seqs_are_dense(waiter)


@both_write_paths
def test_a_run_in_a_model_wait_is_claimed_and_restarted_quietly() -> None:
    """A run parked for a model retry (``wait.kind == "model"``, helper "ends") is claimed
    without ``lease.claimed`` and starts its next try without ``run.started``, on the
    one-statement claim (PostgreSQL, fast) and through the engine's preparation alike."""
    record = {
        "kind": "model",
        "since": timezone.now().isoformat(),
        "last_poll": timezone.now().isoformat(),
        "polls": 3,
        "longest_gap_seconds": 2.0,
        "detail": {"endpoint": "e1"},
    }
    run = make_run(wait=record, cursor={"workdir": "/tmp/lw-waits-workdir"}, attempts=0)
    seq = run.event_seq
    [claim] = run_claim(owner="w1", lease_seconds=60, run_id=run.id)
    if claim.status == RunStatus.PREPARING:
        _, status = _load_and_prepare(claim.lease, 0.0)
        assert status == RunStatus.RUNNING
    run.refresh_from_db()
    assert (run.status, run.event_seq, run.wait, run.attempts) == ("running", seq, record, 1)
    assert types(run) == ["run.created"]


@both_write_paths
def test_attempts_spent_within_a_wait_count_only_the_current_streak() -> None:
    """Claims within a wait are not logged: the exhaustion reason still names only the
    errors of the current streak, not those before the wait began."""
    _, waiter = held_and_waiting()
    LoopRun.objects.filter(pk=waiter.pk).update(max_attempts=3)
    [first] = run_claim(owner="w1", lease_seconds=60, run_id=waiter.id)
    assert run_driver_error(first.lease, "RuntimeError: before the wait") == "queued"
    LoopRun.objects.filter(pk=waiter.pk).update(not_before=None)
    assert poll(waiter, now()) == RunStatus.WAITING_LOCK  # a clean release: a new streak
    statuses = []
    for _ in range(3):
        LoopRun.objects.filter(pk=waiter.pk).update(not_before=None)
        [claim] = run_claim(owner="w1", lease_seconds=60, run_id=waiter.id)
        statuses.append(run_driver_error(claim.lease, "RuntimeError: in the wait"))
    assert statuses == ["queued", "queued", "failed"]
    waiter.refresh_from_db()
    assert waiter.terminal_reason == "driver_error"
    assert "3 times" in waiter.failure_reason and "before the wait" not in waiter.failure_reason
    counts = Counter(types(waiter))
    assert (counts["lease.claimed"], counts["lock.waiting"], counts["wait.ended"]) == (2, 1, 1)
    seqs_are_dense(waiter)


@both_write_paths
def test_locks_are_granted_in_arrival_order() -> None:
    """A run that waited longer for a path gets it first, even when a newer run polls first;
    a newcomer wanting other paths is not held up."""
    holder, first = held_and_waiting()
    second = make_run(
        first.pattern, repository_snapshot={**REPO, "actingOn": ["src"]}, policy_snapshot={}
    )
    elsewhere = make_run(
        first.pattern, repository_snapshot={**REPO, "actingOn": ["docs"]}, policy_snapshot={}
    )
    start = now()
    assert poll(first, start) == RunStatus.WAITING_LOCK
    assert poll(second, start + timedelta(seconds=1)) == RunStatus.WAITING_LOCK
    second.refresh_from_db()
    assert second.wait["detail"]["held_by"] == [str(holder.id)]
    assert second.wait["detail"]["ahead"] == [str(first.id)]

    run_transition(run_id=holder.id, to=RunStatus.CANCELED, actor="op")  # frees src
    assert poll(second, start + timedelta(seconds=2)) == RunStatus.WAITING_LOCK  # first is ahead
    second.refresh_from_db()
    assert second.wait["detail"]["held_by"] == [] and second.wait["polls"] == 2
    said = f"path lock on src queued behind run {str(first.id)[:8]}"
    assert lock_text(second.wait["detail"]) == said
    assert _wait_line("lock.waiting", second.wait["detail"]) == f"waiting for {said}"  # the CLI
    assert poll(elsewhere, start + timedelta(seconds=2)) == RunStatus.SUCCEEDED
    assert poll(first, start + timedelta(seconds=3)) == RunStatus.SUCCEEDED
    assert poll(second, start + timedelta(seconds=4)) == RunStatus.SUCCEEDED
    assert types(second).count("lock.waiting") == 1

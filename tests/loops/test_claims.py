from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from loops.models import LoopEvent, LoopRun, PathLock, RunStatus
from loops.services.claims import run_claim, run_heartbeat, runs_reap
from loops.services.endings import run_transition
from loops.services.locks import path_locks_acquire
from loops.services.steps import step_begin
from loops.services.transitions import Lease
from runtime.invocation import LeaseLost
from tests.support.factories import make_pattern, make_run
from tests.support.write_paths import both_write_paths

pytestmark = pytest.mark.django_db


def expire(run: LoopRun) -> None:
    LoopRun.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=5))


def test_claim_takes_a_queued_run_with_a_lease_and_a_new_token() -> None:
    run = make_run()
    [claim] = run_claim(owner="w1", lease_seconds=60)
    run.refresh_from_db()
    assert claim.lease == Lease(run.id, "w1", 1)
    assert run.status == RunStatus.PREPARING
    assert run.lease_owner == "w1" and run.attempts == 1
    assert run.lease_expires_at > timezone.now() + timedelta(seconds=50)
    event = LoopEvent.objects.get(run=run, seq=2)
    assert (event.type, event.from_status, event.to_status) == (
        "lease.claimed",
        "queued",
        "preparing",
    )


@both_write_paths
def test_claim_skips_runs_with_a_live_lease_and_runs_not_yet_due() -> None:
    make_run(not_before=timezone.now() + timedelta(minutes=5))
    run_claim(owner="w0", lease_seconds=60)
    make_run()
    assert len(run_claim(owner="w1", lease_seconds=60)) == 1
    assert run_claim(owner="w2", lease_seconds=60) == []


@both_write_paths
def test_claim_by_id_only_takes_that_run() -> None:
    first, second = make_run(), make_run()
    [claim] = run_claim(owner="w1", lease_seconds=60, run_id=second.id)
    assert claim.lease.run_id == second.id
    first.refresh_from_db()
    assert first.status == RunStatus.QUEUED


@both_write_paths  # fast, on PostgreSQL: the one-statement claim too
def test_claim_by_ids_takes_the_runnable_ones_of_them_once_each() -> None:
    """Nudged runs claimed together: only those named, each once, those not runnable (leased,
    not due) left alone, a limited pattern's runs counted under its lock, ``limit`` caps."""
    limited = make_pattern(max_concurrency=1)
    free_runs = [make_run() for _ in range(3)]
    capped = [make_run(limited) for _ in range(2)]
    later = make_run(not_before=timezone.now() + timedelta(minutes=5))
    leased = make_run()
    run_claim(owner="w0", lease_seconds=60, run_id=leased.id)
    bystander = make_run()
    named = [*free_runs, free_runs[0], *capped, later, leased]  # one named twice
    claims = run_claim(owner="w1", lease_seconds=60, run_ids=[r.id for r in named])
    claimed = [c.lease.run_id for c in claims]
    assert len(claimed) == len(set(claimed)) == 4
    assert set(claimed) - {capped[0].id, capped[1].id} == {r.id for r in free_runs}
    assert len(set(claimed) & {capped[0].id, capped[1].id}) == 1  # the pattern's one slot
    for run in (later, bystander):
        run.refresh_from_db()
        assert run.status == RunStatus.QUEUED
    assert LoopEvent.objects.filter(type="lease.claimed", run_id__in=claimed).count() == 4
    rest = [make_run() for _ in range(3)]
    capped_to_two = run_claim(owner="w2", lease_seconds=60, limit=2, run_ids=[r.id for r in rest])
    assert {c.lease.run_id for c in capped_to_two} == {rest[0].id, rest[1].id}
    assert run_claim(owner="w2", lease_seconds=60, run_ids=[]) == []


@both_write_paths
def test_a_duplicate_claim_of_the_same_run_does_nothing() -> None:
    run = make_run()
    assert len(run_claim(owner="w1", lease_seconds=60, run_id=run.id)) == 1
    assert run_claim(owner="w2", lease_seconds=60, run_id=run.id) == []


@both_write_paths
def test_pattern_concurrency_limit_holds_runs_back_in_queued() -> None:
    pattern = make_pattern(max_concurrency=2)
    runs = [make_run(pattern) for _ in range(5)]
    other = make_run()
    claims = run_claim(owner="w1", lease_seconds=60, limit=10)
    claimed = {c.lease.run_id for c in claims}
    assert len(claimed & {r.id for r in runs}) == 2
    assert other.id in claimed
    assert run_claim(owner="w2", lease_seconds=60, limit=10) == []


def test_a_parked_run_frees_its_concurrency_slot_only_when_it_ends() -> None:
    pattern = make_pattern(max_concurrency=1)
    waiting = make_run(pattern, status=RunStatus.WAITING_APPROVAL)
    make_run(pattern)
    assert run_claim(owner="w1", lease_seconds=60) == []
    LoopRun.objects.filter(pk=waiting.pk).update(status=RunStatus.SUCCEEDED)
    assert len(run_claim(owner="w1", lease_seconds=60)) == 1


def test_a_stale_workers_step_write_is_refused_by_the_fencing_token() -> None:
    run = make_run()
    [old] = run_claim(owner="w1", lease_seconds=60)
    expire(run)
    report = runs_reap()
    assert report.requeued == [run.id]
    [new] = run_claim(owner="w2", lease_seconds=60)
    assert new.lease.token == old.lease.token + 2  # one bump at reap, one at the new claim
    with pytest.raises(LeaseLost):
        step_begin(old.lease, role="maker", invocation="maker:0", kind="tool", name="x", request={})
    seq = step_begin(
        new.lease, role="maker", invocation="maker:0", kind="tool", name="x", request={}
    )
    assert seq == 1


def test_heartbeat_extends_only_leases_still_held() -> None:
    a, b = make_run(), make_run()
    run_claim(owner="w1", lease_seconds=1, limit=2)
    LoopRun.objects.filter(pk=b.pk).update(lease_owner="someone-else")
    held = run_heartbeat(owner="w1", run_ids=[a.id, b.id], lease_seconds=60)
    assert held == {a.id}
    a.refresh_from_db()
    assert a.lease_expires_at > timezone.now() + timedelta(seconds=50)


def test_reaper_requeues_expired_leases_and_fails_runs_past_the_attempt_limit() -> None:
    retried, exhausted = make_run(max_attempts=3), make_run(max_attempts=1)
    run_claim(owner="w1", lease_seconds=60, limit=2)
    expire(retried)
    expire(exhausted)
    report = runs_reap()
    assert report.requeued == [retried.id]
    assert report.failed == [exhausted.id]
    retried.refresh_from_db()
    exhausted.refresh_from_db()
    assert retried.status == RunStatus.QUEUED and retried.lease_owner is None
    assert exhausted.status == RunStatus.FAILED
    assert exhausted.terminal_reason == "lease_attempts_exhausted"
    assert "died or was killed once in a row" in exhausted.failure_reason


def test_reaper_leaves_live_leases_alone() -> None:
    make_run()
    run_claim(owner="w1", lease_seconds=60)
    assert runs_reap().requeued == []


def test_path_locks_serialise_two_runs_on_overlapping_paths() -> None:
    a, b, c = make_run(), make_run(), make_run()
    assert path_locks_acquire(run_id=a.id, repository_key="repo", paths=["src/app"]) == []
    conflicts = path_locks_acquire(run_id=b.id, repository_key="repo", paths=["src/app/models.py"])
    assert conflicts and conflicts[0]["held"] == "src/app"
    assert path_locks_acquire(run_id=c.id, repository_key="repo", paths=["docs"]) == []
    assert path_locks_acquire(run_id=b.id, repository_key="other-repo", paths=["src/app"]) == []
    run_transition(run_id=a.id, to=RunStatus.CANCELED, actor="op")
    assert not PathLock.objects.filter(run=a).exists()
    assert path_locks_acquire(run_id=b.id, repository_key="repo", paths=["src/app/models.py"]) == []

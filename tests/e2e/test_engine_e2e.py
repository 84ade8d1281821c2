"""The engine with a real worker process: path locks, concurrency limits, cancellation."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from loops.models import LoopRun, LoopStep, RunStatus
from loops.services.runs import run_act
from tests.e2e.conftest import start_worker
from tests.support.factories import make_pattern, make_run
from tests.support.workers import WorkerProcess, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
# No repositoryRoot: the runs work in scratch directories; the locks need only the key.
REPO = {"repositoryKey": "repo", "repositoryRoot": "", "baseRef": "main"}


def finished(n: int) -> bool:
    return LoopRun.objects.filter(status=RunStatus.SUCCEEDED).count() == n


def test_runs_acting_on_overlapping_paths_never_overlap(
    workers: list[WorkerProcess], tmp_path: Path
) -> None:
    pattern = make_pattern()
    first = make_run(pattern, repository_snapshot={**REPO, "actingOn": ["src"]})
    second = make_run(pattern, repository_snapshot={**REPO, "actingOn": ["src/app.py"]})
    apart = make_run(pattern, repository_snapshot={**REPO, "actingOn": ["docs"]})
    start_worker(
        workers, tmp_path, "w1", LW_TEST_STEP_SLEEP="0.3", LOOPWRIGHT_LOCK_RETRY_SECONDS="0.5"
    )
    wait_for(lambda: finished(3), timeout=90, message=workers[0].log()[-3000:])
    runs = {r.id: r for r in LoopRun.objects.all()}
    a, b = sorted([runs[first.id], runs[second.id]], key=lambda r: r.finished_at)
    later_started = b.events.filter(type="run.started").get().created_at
    assert later_started >= a.finished_at, "the second run acted while the first held the lock"
    assert b.events.filter(type="lock.waiting").exists()
    assert not runs[apart.id].events.filter(type="lock.waiting").exists()


def test_a_pattern_concurrency_limit_holds_with_a_real_worker(
    workers: list[WorkerProcess], tmp_path: Path
) -> None:
    pattern = make_pattern(max_concurrency=1)
    for _ in range(3):
        make_run(pattern)
    start_worker(workers, tmp_path, "w1", LW_TEST_STEP_SLEEP="0.1")
    wait_for(lambda: finished(3), timeout=90, message=workers[0].log()[-3000:])
    spans = sorted(
        (r.events.get(type="lease.claimed").created_at, r.finished_at)
        for r in LoopRun.objects.all()
    )
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, "two runs of a concurrency-1 pattern were in flight together"


def test_cancelling_a_running_run_stops_its_worker_from_writing(
    workers: list[WorkerProcess], tmp_path: Path
) -> None:
    run = make_run(make_pattern())
    start_worker(workers, tmp_path, "w1", LW_TEST_STEPS="50", LW_TEST_STEP_SLEEP="0.2")
    wait_for(
        lambda: LoopStep.objects.filter(run=run).count() >= 3,
        timeout=60,
        message=workers[0].log()[-3000:],
    )
    run_act(run_id=run.id, action="cancel", actor="operator", reason="enough")
    steps_at_cancel = LoopStep.objects.filter(run=run).count()
    import time

    time.sleep(3)  # more than a heartbeat: the worker notices and stops
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELED and run.terminal_reason == "canceled"
    assert LoopStep.objects.filter(run=run).count() <= steps_at_cancel + 1
    assert "lease lost" in workers[0].log() or "driving cancelled" in workers[0].log()

"""D6: duplicate Celery deliveries are harmless, because the claim in the database decides.

docs/reliability.md D6. A Celery message is only a nudge; a second delivery of the same nudge
(redelivery after the Redis visibility timeout, a retried publish, a re-enqueue by the reaper)
must find the run already leased or finished and do nothing.

Redelivery is simulated by publishing each run's ``loops.drive_run`` nudge several times on
purpose, at three moments: all copies at once before any worker claimed the run (two workers
race to claim it by id), again while the runs are being driven, and again after they finished.
A real broker-side redelivery after ``visibility_timeout`` is not provoked: ``drive_run`` is
acked early and returns in milliseconds, and the timeout is not configurable from the
environment (``CELERY_BROKER_TRANSPORT_OPTIONS`` is fixed to 3600 s in settings); from the
engine's point of view a redelivered message is exactly a second copy of the same message.

Pass criteria as implemented (40 runs x 9 side-effecting steps, 2 workers, 15 copies per run):

- every copy was delivered to a worker: the workers' logs count at least the 600 published
  nudges plus one per re-queue the engine did itself (a run parked back in ``queued`` is nudged
  again by ``run_transition``). At least, not exactly: delivery is at-least-once on every broker
  (CI saw the embedded filesystem broker hand one of 600 messages out twice), and a message
  arriving twice is the very case this test shows to be harmless;
- each run was claimed exactly once and finished exactly once;
- each step executed exactly once: attempts == effects == distinct keys == 360;
- no worker died.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import pytest

from loops.models import LoopEvent, LoopRun, LoopStep, RunStatus
from loops.tasks import drive_run
from tests.e2e.conftest import start_worker
from tests.support.chaos import attempts_per_key, claims_per_run, effect_rows, log_tails
from tests.support.factories import make_pattern, make_run
from tests.support.workers import WorkerProcess, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

RUNS = 40
COPIES = 5  # per run, at each of the three moments
STEPS_PER_RUN = 9  # leader, maker, verifier x 3
ENV = {"LW_TEST_STEPS": "3", "LW_TEST_STEP_SLEEP": "0.1"}


def _publish(run_ids: list[uuid.UUID]) -> int:
    for run_id in run_ids:
        for _ in range(COPIES):
            drive_run.apply_async(args=(str(run_id),))
    return len(run_ids) * COPIES


RECEIVED = re.compile(r"Task loops\.drive_run\[[0-9a-f-]+\] received")


def _received(workers: list[WorkerProcess]) -> int:
    return sum(len(RECEIVED.findall(w.log())) for w in workers)


def test_every_run_is_claimed_and_executed_once_however_often_its_nudge_arrives(
    workers: list[WorkerProcess], tmp_path: Path, clean_broker: None
) -> None:
    for name in ("w1", "w2"):
        start_worker(workers, tmp_path, name, **ENV)
    pattern = make_pattern()
    run_ids = [make_run(pattern).id for _ in range(RUNS)]

    published = _publish(run_ids)  # before any claim: the workers race for each run
    # Claimed (a run may already be past RUNNING when the publishing ends, on a busy machine).
    wait_for(lambda: LoopRun.objects.exclude(status=RunStatus.QUEUED).exists(), timeout=30)
    published += _publish(run_ids)  # while the runs are being driven
    wait_for(
        lambda: LoopRun.objects.filter(status=RunStatus.SUCCEEDED).count() == RUNS,
        timeout=120,
        message=log_tails(workers),
    )
    published += _publish(run_ids)  # after they finished
    wait_for(lambda: _received(workers) >= published, timeout=60, message=log_tails(workers))
    time.sleep(1)  # the last nudges' (no-op) claims

    print(f"nudges published {published}, received {_received(workers)}")
    assert all(w.alive() for w in workers), log_tails(workers)
    requeues = LoopEvent.objects.filter(to_status=RunStatus.QUEUED).exclude(type="run.created")
    assert _received(workers) >= published + requeues.count()  # no nudge lost
    claims = claims_per_run()
    assert sorted(claims.values()) == [1] * RUNS
    finished = LoopEvent.objects.filter(to_status=RunStatus.SUCCEEDED)
    assert sorted(finished.values_list("run_id", flat=True)) == sorted(run_ids)
    expected = RUNS * STEPS_PER_RUN
    attempts = attempts_per_key()
    assert sum(attempts.values()) == len(attempts) == len(effect_rows()) == expected
    assert LoopStep.objects.filter(status="completed").count() == expected

"""The embedded default's broker (kombu ``filesystem://``) must survive concurrent publishing.

Found while running D1 on SQLite: a worker died with ``Unrecoverable error: JSONDecodeError``.
kombu's filesystem transport creates the message file, *then* writes it (under an advisory lock
that the reader never takes); a consumer that lists the folder in between moves the still-empty
file away, reads ``b""`` and the consumer crashes, taking the whole ``celery worker`` down. Beat
(reaper every few seconds) and every worker (nudges after transitions) publish concurrently with
the consumers' 50 ms polling, so the embedded default loses workers at random.

This test publishes nudges (for run ids that do not exist, so each is a no-op claim) from
several processes while one worker consumes, and requires the worker to stay up and to receive
every message. Under CPU load a publisher is often descheduled between creating the file and
writing it; the publishers here make that window certain by pausing 50 ms right after the
file is created (kombu's own ``_put`` runs unchanged around the pause).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.chaos import log_tails
from tests.support.workers import ROOT, WorkerProcess, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PUBLISHERS = 3
MESSAGES = 100

PUBLISH = """
import time, uuid, django
django.setup()
from kombu.transport import filesystem
from loops.tasks import drive_run

_lock = filesystem.lock

def preempted_lock(f, flags):
    time.sleep(0.05)  # descheduled right after open(): the empty file is already visible
    return _lock(f, flags)

filesystem.lock = preempted_lock
for _ in range({n}):
    drive_run.apply_async(args=(str(uuid.uuid4()),))
"""


def test_a_worker_on_the_filesystem_broker_survives_bursts_of_concurrent_nudges(
    workers: list[WorkerProcess], tmp_path: Path
) -> None:
    var_dir = tmp_path / "var"  # a broker folder of its own
    env = {"CELERY_BROKER_URL": "filesystem://", "LOOPWRIGHT_VAR_DIR": str(var_dir)}
    worker = WorkerProcess("fs", tmp_path, env).start()
    workers.append(worker)
    worker.wait_ready(timeout=90)

    publishers = [
        subprocess.Popen(
            [sys.executable, "-c", PUBLISH.format(n=MESSAGES)],
            cwd=ROOT,
            env={**os.environ, **env},
            start_new_session=True,
        )
        for _ in range(PUBLISHERS)
    ]
    try:
        for publisher in publishers:
            assert publisher.wait(timeout=120) == 0
    finally:
        for publisher in publishers:
            if publisher.poll() is None:
                os.killpg(publisher.pid, 9)

    def received() -> int:
        return worker.log().count("] received")

    total = PUBLISHERS * MESSAGES
    try:
        wait_for(lambda: not worker.alive() or received() >= total, timeout=120)
    finally:
        print(f"worker received {received()} of {total} nudges; alive: {worker.alive()}")
    assert "Unrecoverable error" not in worker.log(), log_tails([worker])
    assert worker.alive(), log_tails([worker])
    assert received() >= total

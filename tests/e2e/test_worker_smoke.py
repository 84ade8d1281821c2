from __future__ import annotations

from pathlib import Path

import pytest

from loops.models import LoopRun, RunStatus
from tests.e2e.conftest import start_worker
from tests.support.factories import make_pattern, make_run
from tests.support.invokers import side_effect_counts
from tests.support.workers import WorkerProcess, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_a_real_worker_drives_queued_runs_to_success_exactly_once(
    workers: list[WorkerProcess], tmp_path: Path
) -> None:
    pattern = make_pattern()
    runs = [make_run(pattern) for _ in range(5)]
    start_worker(workers, tmp_path, "w1")
    wait_for(
        lambda: LoopRun.objects.filter(status=RunStatus.SUCCEEDED).count() == 5,
        timeout=60,
        message=workers[0].log()[-3000:],
    )
    counts = side_effect_counts()
    # leader + 1 maker + verifier, 3 steps each
    assert counts == {"effects": 45, "attempts": 45, "attempted_keys": 45}
    for run in runs:
        run.refresh_from_db()
        assert run.terminal_reason == "verified"
        assert run.lease_owner is None
        assert list(run.events.values_list("type", flat=True))[:3] == [
            "run.created",
            "lease.claimed",
            "run.started",
        ]

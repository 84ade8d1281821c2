"""D11 with real processes and the real clock: two scheduler processes tick an every-second
cron at once, and every second is accounted for exactly once (fired, or folded into one fire
by coalescing when a tick ran late), with no (pattern, second) fired twice."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from datetime import timedelta

import pytest
from django.db import connection

from loops.models import CronFire, CronSchedule, LoopRun
from loops.triggers.scheduler import cron_schedule_sync, db_now
from tests.support import workers
from tests.triggers.conftest import cron_pattern

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]
PATTERNS = 10
SECONDS = 8
MIN_TICKS = 10

# Ticks for SECONDS and at least MIN_TICKS times (a loaded machine makes ticks slow).
SCHEDULER = """
import sys, time, django
django.setup()
from loops.triggers.scheduler import cron_tick
deadline, least = time.time() + float(sys.argv[1]), int(sys.argv[2])
ticks = 0
while time.time() < deadline or ticks < least:
    cron_tick()
    ticks += 1
    time.sleep(0.05)
print(ticks)
"""


def test_two_scheduler_processes_fire_each_second_once(seeded_profiles: None) -> None:
    patterns = [cron_pattern("* * * * * *") for _ in range(PATTERNS)]  # every second
    now = db_now()
    for pattern in patterns:
        cron_schedule_sync(pattern, now=now)
    first_due = {s.pattern_id: s.next_fire_at for s in CronSchedule.objects.all()}
    connection.close()  # SQLite: let the schedulers write without waiting on this connection
    env = {**os.environ, "DATABASE_URL": workers.test_database_url(), "PYTHONUNBUFFERED": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCHEDULER, str(SECONDS), str(MIN_TICKS)],
            cwd=workers.ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=270) for proc in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
        assert int(out.strip().splitlines()[-1]) >= MIN_TICKS

    covered: dict[int, int] = defaultdict(int)
    last: dict[int, object] = {}
    for fire in CronFire.objects.order_by("scheduled_for"):
        assert fire.outcome == "started" and fire.run_id is not None
        covered[fire.pattern_id] += fire.missed + 1
        last[fire.pattern_id] = fire.scheduled_for
    assert set(covered) == {p.pk for p in patterns}
    for pattern in patterns:
        span = last[pattern.pk] - first_due[pattern.pk]  # type: ignore[operator]
        assert isinstance(span, timedelta)
        # Every second from the first due one to the last fired one, each exactly once.
        assert covered[pattern.pk] == int(span.total_seconds()) + 1
    assert LoopRun.objects.filter(trigger_type="cron").count() == CronFire.objects.count()
    assert CronFire.objects.values("scheduler").distinct().count() >= 1

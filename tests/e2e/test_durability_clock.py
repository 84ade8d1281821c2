"""Lease expiry uses only the database clock (docs/reliability.md §1 "Clock skew", D5).

Three layers of evidence:

1. A static check: the SQL of every lease decision (claim, heartbeat, reaper, fenced writes) is
   built from ``now_sql()``/``now_plus_sql()`` and never from a Python clock.
2. In-process with ``time-machine``: with the Python clock 120 s ahead or behind, a claim's
   expiry is still "database now + TTL", a live lease is neither stolen nor reaped, and a
   heartbeat extends from database time.
3. Real processes under ``faketime`` (Debian package ``faketime``; PostgreSQL only): a worker
   120 s ahead, one 120 s behind, one on time and ``celery beat`` 120 s ahead drive runs that
   last longer than the lease. No run is claimed twice, no lease expires, every effect once.
   On SQLite the "database clock" is the clock of whichever process runs the statement (SQLite
   is a library), so per-process skew cannot be separated from the database there; the
   embedded default runs on one host, where there is one clock.

A fourth test shows that retry and lock-wait delays (``not_before``) are still computed from
the worker's clock, so a skewed worker shifts them by its skew (see the report).
"""

from __future__ import annotations

import inspect
import re
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.db import connection
from django.utils import timezone

from loops.models import LoopEvent, LoopRun, RunStatus
from loops.services import budget_sql, claims, transitions
from loops.services.claims import run_claim, run_heartbeat, runs_reap
from loops.worker import model_waits
from orchestrator.sql import now_sql
from runtime.invocation import RetryLater
from tests.e2e.conftest import start_beat, start_worker
from tests.support.chaos import (
    attempts_per_key,
    claims_per_run,
    effect_rows,
    faketime_env,
    libfaketime,
    log_tails,
)
from tests.support.claims import start_claimed
from tests.support.factories import make_pattern, make_run
from tests.support.workers import WorkerProcess, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SKEW = timedelta(seconds=120)
LEASE_FUNCTIONS = [
    claims._candidates_sql,
    claims._take_sql,
    claims.run_heartbeat,
    claims._expired_leases,
    claims._expired_leases_for,
    transitions.fence_touch_sql,  # the statement of transitions.fenced_touch
    budget_sql.fence_limits_sql,  # the fence of the journal's batched writes
]
PYTHON_CLOCKS = ("timezone.now", "datetime.now", "datetime.utcnow", "time.time", "time.monotonic")


def database_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {now_sql().replace('%%', '%')}")
        value = cursor.fetchone()[0]
    if isinstance(value, str):  # SQLite returns the text it stores
        value = datetime.fromisoformat(value).replace(tzinfo=UTC)
    return value


def test_the_lease_sql_is_built_from_the_database_clock_only() -> None:
    for function in LEASE_FUNCTIONS:
        source = inspect.getsource(function)
        used = [clock for clock in PYTHON_CLOCKS if clock in source]
        assert used == [], f"{function.__qualname__} reads a Python clock: {used}"
        assert "now_sql()" in source or "now_plus_sql()" in source or "now = db" in source, (
            f"{function.__qualname__} decides on a lease without the database clock"
        )


@pytest.mark.parametrize("skew", [SKEW, -SKEW], ids=["ahead", "behind"])
def test_a_skewed_python_clock_changes_no_lease_decision(skew: timedelta) -> None:
    live = make_run()
    [held] = run_claim(owner="honest", lease_seconds=30)
    make_run()
    with time_machine.travel(timezone.now() + skew, tick=True):
        [claim] = run_claim(owner="skewed", lease_seconds=30)
        assert claim.lease.run_id != live.id  # the live lease is not stolen...
        assert runs_reap().requeued == []  # ...nor reaped
        assert run_heartbeat(owner="honest", run_ids=[live.id], lease_seconds=30) == {live.id}
        skewed_run = LoopRun.objects.get(pk=claim.lease.run_id)
        live.refresh_from_db()
        now = database_now()
    for expiry in (skewed_run.lease_expires_at, live.lease_expires_at):
        assert abs((expiry - now).total_seconds() - 30) < 5, (expiry, now)
    assert held.lease.owner == "honest"


def test_a_retry_delay_is_measured_on_the_database_clock() -> None:
    """Fails today: ``model_waits.park_for_retry`` (and ``_park_for_lock``,
    ``locks._wake_lock_waiters``) compute ``not_before`` from the worker's clock, so a worker
    120 s ahead parks a 30 s retry for 150 s, and one 120 s behind retries at once."""
    make_run()
    [claim] = run_claim(owner="skewed", lease_seconds=30)
    start_claimed(claim)
    with time_machine.travel(timezone.now() + SKEW, tick=True):
        model_waits.park_for_retry(claim.lease, RetryLater("endpoint down", 30), {})
    run = LoopRun.objects.get(pk=claim.lease.run_id)
    delay = (run.not_before - database_now()).total_seconds()
    assert 25 < delay <= 30, f"a 30 s retry is due in {delay:.0f} s by the database clock"


def _ready_clock_offset(worker: WorkerProcess) -> float:
    """How far the worker's wall clock is from ours: its "ready." log line was written a moment
    ago (``start_worker`` has just seen it)."""
    [stamp] = re.findall(r"^(\S+ \S+),\d+ .* ready\.$", worker.log(), re.M)
    ready = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S")  # local time, like logging
    return round((ready - datetime.now()).total_seconds())


needs_faketime = pytest.mark.skipif(
    libfaketime() is None, reason="libfaketime not installed (apt-get install faketime)"
)


@pytest.mark.postgres
@needs_faketime
def test_workers_with_skewed_clocks_neither_steal_nor_lose_leases(
    workers: list[WorkerProcess], procs: list[Any], tmp_path: Path, clean_broker: None
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("SQLite's clock is the calling process's clock (see the module docstring)")
    slow = {"LW_TEST_STEPS": "3", "LW_TEST_STEP_SLEEP": "0.45", "LOOPWRIGHT_DRIVER_CAPACITY": "4"}
    start_beat(procs, tmp_path, 1.0, **faketime_env("+120s"))
    skewed, offsets = [], []
    for name, offset in (("ahead", "+120s"), ("behind", "-120s")):
        skewed.append(start_worker(workers, tmp_path, name, **slow, **faketime_env(offset)))
        offsets.append(_ready_clock_offset(skewed[-1]))
    start_worker(workers, tmp_path, "ontime", **slow)
    print(f"worker clocks (ahead, behind): {offsets}")
    assert offsets[0] > 90 and offsets[1] < -90  # faketime really shifted their clocks
    pattern = make_pattern()  # only now: each worker (capacity 4) takes a share of the 12
    runs = [make_run(pattern) for _ in range(12)]
    wait_for(
        lambda: LoopRun.objects.filter(status=RunStatus.SUCCEEDED).count() == len(runs),
        timeout=120,
        message=log_tails([*workers, *procs]),
    )
    drivers = Counter(
        int(e.actor.split(":")[1]) for e in LoopEvent.objects.filter(type="lease.claimed")
    )
    print(f"runs claimed per worker: { {w.name: drivers[w.pid] for w in workers} }")
    assert all(drivers[w.pid] > 0 for w in skewed)  # the skewed workers really took part
    assert sorted(claims_per_run().values()) == [1] * len(runs)
    assert not LoopEvent.objects.filter(type="lease.expired").exists()
    attempts = attempts_per_key()
    assert sum(attempts.values()) == len(attempts) == len(effect_rows()) == len(runs) * 9

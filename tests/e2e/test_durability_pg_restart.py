"""D8: a PostgreSQL restart in the middle of 30 active runs costs nothing but a little time.

docs/reliability.md D8 (catalogue: 50 runs; here 30). The test never touches the machine's
shared cluster: it creates a private one (``initdb`` + ``pg_ctl``, trust auth, loopback, a free
port, files in a temp dir), migrates a database there with ``manage.py migrate`` in a
subprocess, and runs two ``celery worker`` processes and ``celery beat`` (reaper every 1 s)
against it. With the runs in flight it does ``pg_ctl restart -m fast``: every connection of
every worker is terminated. The cluster is dropped afterwards.

Pass criteria as implemented:

- all 30 runs end ``succeeded``;
- the same two worker processes carry on (no restart by hand): each writes again (an event of
  its own) within 30 s of the database coming back;
- 0 duplicate side effects: effect rows == distinct keys == 450, and no key attempted more than
  twice (one interruption can re-issue the step in flight, once);
- 0 runs stuck: sampled every 0.5 s from the restart on, no run is active with a lease that
  expired more than 2 reaper intervals (+1 s for the reaper's own round trip) ago.

Runs only in the PostgreSQL configuration (its broker is Redis; the embedded default has no
database server to restart) and where the PostgreSQL server binaries exist.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests.e2e.conftest import start_beat
from tests.support.chaos import (
    PostgresCluster,
    django_subprocess,
    log_tails,
    manage_migrate,
    owner_prefix,
    postgres_cluster_unavailable,
)
from tests.support.workers import WorkerProcess, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RUNS = 30
STEPS_PER_RUN = 15
REAPER_SECONDS = 1.0
RECONNECT_WITHIN = 30.0
DB = "lw_d8"
ACTIVE = "('preparing', 'running', 'verifying')"

SEED = f"""
from tests.support.factories import make_pattern, make_run
from tests.support.invokers import create_side_effect_tables
create_side_effect_tables()
pattern = make_pattern()
print(json.dumps([str(make_run(pattern).id) for _ in range({RUNS})]))
"""


@pytest.fixture
def cluster(procs: list[Any]) -> PostgresCluster:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL configuration only (DATABASE_URL is SQLite)")
    reason = postgres_cluster_unavailable()
    if reason:
        pytest.skip(reason)
    cluster = PostgresCluster()
    procs.append(cluster)  # destroyed at teardown, even on failure
    cluster.init().start()
    cluster.create_database(DB)
    return cluster


def _count(cluster: PostgresCluster, sql: str, params: tuple[Any, ...] = ()) -> int:
    return int(cluster.query(DB, sql, params)[0][0])


def test_workers_ride_out_a_postgresql_restart_without_losing_or_repeating_work(
    cluster: PostgresCluster, procs: list[Any], tmp_path: Path
) -> None:
    env = {"DATABASE_URL": cluster.url(DB)}
    manage_migrate(env)
    django_subprocess(SEED, env)
    start_beat(procs, tmp_path, REAPER_SECONDS, **env)
    workers = [
        WorkerProcess(name, tmp_path, {**env, "LW_TEST_STEPS": "5", "LW_TEST_STEP_SLEEP": "0.3",
                                       "LOOPWRIGHT_DRIVER_CAPACITY": "15"}).start()
        for name in ("w1", "w2")
    ]  # fmt: skip
    procs.extend(workers)
    for worker in workers:
        worker.wait_ready(timeout=90)
    wait_for(
        lambda: (
            _count(cluster, f"SELECT count(*) FROM loops_looprun WHERE status IN {ACTIVE}")
            >= RUNS * 2 // 3
        ),
        timeout=60,
        message=log_tails(workers),
    )

    restart_at = time.time()
    cluster.restart()
    back_at = time.time()
    print(f"pg_ctl restart -m fast took {back_at - restart_at:.1f} s")
    stuck = _watch_until_done(cluster, workers, procs)

    assert stuck == [], f"runs active with a long-expired lease: {stuck[:5]}"
    assert all(w.alive() for w in workers), log_tails(workers)
    for worker in workers:
        first = _first_write_after(cluster, owner_prefix(worker), back_at)
        assert first is not None and first - back_at <= RECONNECT_WITHIN, (worker.name, first)
        print(f"{worker.name} wrote again {first - back_at:.1f} s after the restart")
    _assert_no_duplicate_effects(cluster)


def _watch_until_done(
    cluster: PostgresCluster, workers: list[WorkerProcess], procs: list[Any]
) -> list[tuple[float, int]]:
    """Sample for stuck runs until every run succeeded; returns the bad samples."""
    grace = 2 * REAPER_SECONDS + 1
    stuck_sql = (
        f"SELECT count(*) FROM loops_looprun WHERE status IN {ACTIVE} "
        "AND lease_expires_at < clock_timestamp() - make_interval(secs => %s)"
    )
    bad: list[tuple[float, int]] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            stuck = _count(cluster, stuck_sql, (grace,))
            done = _count(cluster, "SELECT count(*) FROM loops_looprun WHERE status = 'succeeded'")
        except Exception:  # the restart itself, or a connection refused while it starts
            time.sleep(0.5)
            continue
        if stuck:
            bad.append((time.time(), stuck))
        if done == RUNS:
            return bad
        time.sleep(0.5)
    raise AssertionError("runs did not finish after the restart\n" + log_tails([*workers, *procs]))


def _first_write_after(cluster: PostgresCluster, prefix: str, moment: float) -> float | None:
    rows = cluster.query(
        DB,
        "SELECT min(extract(epoch FROM created_at)) FROM loops_loopevent "
        "WHERE actor LIKE %s AND created_at > to_timestamp(%s)",
        (prefix + "%", moment),
    )
    return float(rows[0][0]) if rows[0][0] is not None else None


def _assert_no_duplicate_effects(cluster: PostgresCluster) -> None:
    effects = _count(cluster, "SELECT count(*) FROM lw_test_side_effects")
    keys = _count(
        cluster, "SELECT count(DISTINCT idempotency_key) FROM lw_test_side_effect_attempts"
    )
    attempts = _count(cluster, "SELECT count(*) FROM lw_test_side_effect_attempts")
    worst = _count(
        cluster,
        "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM lw_test_side_effect_attempts "
        "GROUP BY idempotency_key) a",
    )
    print(f"side effects: {effects} applied, {attempts} attempts over {keys} keys")
    assert effects == keys == RUNS * STEPS_PER_RUN
    assert worst <= 2

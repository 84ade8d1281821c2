"""Database work off the event loop (``orchestrator.dbthreads.OffLoopDb``, used by the tool
providers, the memory prompt and the instructions' rendering inside a worker's runs): a pool's
threads keep their connection between calls, so a burst of calls uses one backend per thread
instead of a connect per call; a failed statement leaves the next call a working connection;
``off_loop_threads_close`` leaves no connection behind."""

from __future__ import annotations

import asyncio

import pytest
from django.db import DatabaseError, connection

from orchestrator.dbthreads import OffLoopDb, off_loop_threads_close

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("counts PostgreSQL backends; SQLite has no server connections to count")


def _backend() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def _alive(pids: set[int]) -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [list(pids)])
        return {int(pid) for (pid,) in cursor.fetchall()}


def _burst(pool: OffLoopDb, calls: int) -> set[int]:
    async def burst() -> list[int]:
        return await asyncio.gather(*(pool.run(_backend) for _ in range(calls)))

    return set(asyncio.run(burst()))


def test_a_burst_of_calls_reuses_each_threads_connection() -> None:
    pool = OffLoopDb("test-off-loop-burst", max_workers=2)
    first = _burst(pool, 40)
    assert 1 <= len(first) <= 2  # one backend per thread, not one per call
    assert _burst(pool, 40) <= first  # and the same ones for the next burst
    assert _alive(first) == first  # kept open between calls


def test_a_failed_statement_leaves_the_next_call_a_working_connection() -> None:
    pool = OffLoopDb("test-off-loop-error", max_workers=1)

    def fails() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")

    async def failing() -> None:
        await pool.run(fails)

    with pytest.raises(DatabaseError):
        asyncio.run(failing())
    assert len(_burst(pool, 5)) == 1


def test_closing_the_pools_leaves_no_connection_behind() -> None:
    pool = OffLoopDb("test-off-loop-close", max_workers=2)
    used = _burst(pool, 20)
    off_loop_threads_close()
    assert _alive(used) == set()
    assert len(_burst(pool, 5)) >= 1  # and the pool connects again when asked

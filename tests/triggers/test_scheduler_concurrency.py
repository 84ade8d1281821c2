"""D11 (docs/reliability.md): two schedulers at once never double-fire a (pattern, scheduled time).

Two threads, each with its own database connection, run the real tick over the same every-minute
patterns for several simulated minutes, released together at each minute so that they really
race. Exactly one fire row and one run per (pattern, minute), enforced by the unique
constraint. PostgreSQL claims with SKIP LOCKED (500 patterns x 3 minutes); SQLite serialises
the write transactions (100 patterns x 5 minutes). test_scheduler_processes.py runs the same
check with two real scheduler processes on the real clock.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import Count

from loops.cron import FireDecision
from loops.models import CronFire, LoopPattern, LoopRun
from loops.triggers import scheduler
from loops.triggers.scheduler import TickReport, cron_schedule_sync, cron_tick
from tests.triggers.conftest import T0

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]


def in_threads(count: int, work: Callable[[int, threading.Barrier], Any]) -> list[Any]:
    """Run ``work(i, barrier)`` in ``count`` threads; exceptions are returned, not raised."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def run(index: int) -> None:
        try:
            results[index] = work(index, barrier)
        except Exception as exc:  # the assertions look at every outcome
            barrier.abort()
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=500)
    assert not any(t.is_alive() for t in threads), "a scheduler thread hung"
    return results


def every_minute_patterns(count: int) -> list[LoopPattern]:
    patterns = LoopPattern.objects.bulk_create(
        LoopPattern(
            key=f"cron-{n:04d}",
            goal_template="tick {{ event.scheduled_for }}",
            trigger_type="cron",
            cron_expression="* * * * *",
            leader_username="leader",
            maker_usernames=["maker"],
            verifier_username="verifier",
        )
        for n in range(count)
    )
    for pattern in patterns:
        cron_schedule_sync(pattern, now=T0)
    return patterns


def two_schedulers(minutes: int) -> list[list[TickReport]]:
    def scheduler_loop(index: int, barrier: threading.Barrier) -> list[TickReport]:
        reports = []
        for minute in range(1, minutes + 1):
            barrier.wait(timeout=120)
            now = T0 + timedelta(minutes=minute, seconds=index)  # slightly different clocks
            reports.append(cron_tick(now=now, limit=10_000))
        return reports

    results = in_threads(2, scheduler_loop)
    for result in results:
        if isinstance(result, Exception):
            raise result
    return results


def assert_exactly_once(patterns: int, minutes: int, reports: list[list[TickReport]]) -> None:
    expected = {T0 + timedelta(minutes=m) for m in range(1, minutes + 1)}
    per_pattern = CronFire.objects.values("pattern_id").annotate(n=Count("id"))
    assert {row["n"] for row in per_pattern} == {minutes}
    assert len(per_pattern) == patterns
    assert set(CronFire.objects.values_list("scheduled_for", flat=True).distinct()) == expected
    keys = Counter(CronFire.objects.values_list("pattern_id", "scheduled_for"))
    assert max(keys.values()) == 1  # 0 duplicates
    assert (
        CronFire.objects.filter(outcome="started", run__isnull=False).count() == patterns * minutes
    )
    assert LoopRun.objects.filter(trigger_type="cron").count() == patterns * minutes
    refs = Counter(LoopRun.objects.values_list("pattern_id", "trigger_ref"))
    assert max(refs.values()) == 1
    started = [len(r.started) for thread in reports for r in thread]
    assert sum(started) == patterns * minutes
    assert sum(r.errors for thread in reports for r in thread) == 0


def test_two_schedulers_fire_500_every_minute_patterns_exactly_once_on_postgresql(
    seeded_profiles: None,
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only (SKIP LOCKED claims); the SQLite variant runs below")
    every_minute_patterns(500)
    reports = two_schedulers(3)  # 1,500 fire times
    assert_exactly_once(500, 3, reports)
    # Both schedulers did real work: SKIP LOCKED shared the rows out between them.
    per_thread = [sum(len(r.started) for r in thread) for thread in reports]
    assert all(n > 0 for n in per_thread), per_thread


def test_two_schedulers_fire_every_minute_patterns_exactly_once_on_sqlite(
    seeded_profiles: None,
) -> None:
    if connection.vendor != "sqlite":
        pytest.skip("the SQLite variant; PostgreSQL runs the 500-pattern test")
    every_minute_patterns(100)
    reports = two_schedulers(5)
    assert_exactly_once(100, 5, reports)


def test_racing_inserts_of_the_same_fire_start_one_run(seeded_profiles: None) -> None:
    """The final guard without the row claim: both threads try to fire the same times."""
    [pattern] = every_minute_patterns(1)
    times = [T0 + timedelta(minutes=m) for m in range(1, 11)]

    def fire_all(index: int, barrier: threading.Barrier) -> TickReport:
        from django.db import transaction

        report = TickReport(now=T0)
        for moment in times:
            barrier.wait(timeout=60)
            with transaction.atomic():
                decision = FireDecision(fire_at=moment, missed=0, missed_capped=False)
                scheduler._fire(pattern, decision, moment, report)
        return report

    reports = in_threads(2, fire_all)
    assert all(isinstance(r, TickReport) for r in reports), reports
    assert sum(len(r.started) for r in reports) == len(times)
    assert sum(r.duplicates for r in reports) == len(times)
    assert LoopRun.objects.filter(pattern=pattern).count() == len(times)

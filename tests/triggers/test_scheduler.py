"""The scheduler tick with an injected clock: fires, coalescing and skipping, pauses, DST."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import pytest
from django.db import transaction

from loops.cron import FireDecision
from loops.models import CronFire, CronSchedule, LoopEvent, LoopPattern, LoopRun
from loops.triggers import scheduler
from loops.triggers.scheduler import TickReport, cron_schedule_sync, cron_tick
from tests.triggers.conftest import T0, cron_pattern

pytestmark = pytest.mark.django_db


def minutes(n: float) -> timedelta:
    return timedelta(minutes=n)


def fires_of(pattern: LoopPattern) -> list[CronFire]:
    return list(CronFire.objects.filter(pattern=pattern).order_by("scheduled_for"))


def schedule_of(pattern: LoopPattern) -> CronSchedule:
    return CronSchedule.objects.get(pattern=pattern)


def test_the_hook_gives_a_new_cron_pattern_its_first_fire_time() -> None:
    pattern = cron_pattern("*/5 * * * *")
    schedule = cron_schedule_sync(pattern, now=T0 + minutes(2))
    assert schedule is not None and schedule.next_fire_at == T0 + minutes(5)
    assert schedule.paused_reason == ""


def test_the_tick_creates_missing_schedules_itself_and_fires_nothing_early() -> None:
    pattern = cron_pattern("0 * * * *")
    report = cron_tick(now=T0 + minutes(1))
    assert report.synced == 1 and report.started == []
    assert schedule_of(pattern).next_fire_at == T0 + minutes(60)


def test_a_due_time_fires_one_run_and_the_schedule_moves_to_the_next() -> None:
    pattern = cron_pattern("*/5 * * * *", goal_template="Report for {{ event.scheduled_for }}")
    cron_schedule_sync(pattern, now=T0)
    report = cron_tick(now=T0 + minutes(5) + timedelta(seconds=3))
    [fire] = fires_of(pattern)
    assert report.started == [fire.run_id]
    assert (fire.scheduled_for, fire.outcome, fire.missed) == (T0 + minutes(5), "started", 0)
    assert fire.run_id is not None
    run = LoopRun.objects.get(pk=fire.run_id)
    assert (run.trigger_type, run.triggered_by, run.trigger_ref) == (
        "cron",
        "scheduler",
        "2030-01-07T09:05:00Z",
    )
    assert run.goal == "Report for 2030-01-07T09:05:00Z"
    schedule = schedule_of(pattern)
    assert schedule.next_fire_at == T0 + minutes(10)
    assert schedule.last_fired_at == T0 + minutes(5)


def test_ticking_again_at_the_same_time_fires_nothing_more() -> None:
    pattern = cron_pattern("*/5 * * * *")
    cron_schedule_sync(pattern, now=T0)
    for _ in range(3):
        cron_tick(now=T0 + minutes(5))
    assert len(fires_of(pattern)) == 1 and LoopRun.objects.filter(pattern=pattern).count() == 1


def test_every_due_time_fires_once_over_half_an_hour_of_ticks_every_15_seconds() -> None:
    pattern = cron_pattern("*/5 * * * *")
    cron_schedule_sync(pattern, now=T0)
    for tick in range(1, 4 * 30 + 1):
        cron_tick(now=T0 + timedelta(seconds=15 * tick))
    assert [f.scheduled_for for f in fires_of(pattern)] == [
        T0 + minutes(5 * k) for k in range(1, 7)
    ]
    assert all(f.missed == 0 for f in fires_of(pattern))


def test_after_downtime_coalesce_starts_one_run_for_the_latest_missed_time() -> None:
    pattern = cron_pattern("*/5 * * * *", missed_fire_policy="coalesce")
    cron_schedule_sync(pattern, now=T0)
    report = cron_tick(now=T0 + minutes(62))  # down from 09:00 to 10:02
    [fire] = fires_of(pattern)
    assert (fire.scheduled_for, fire.missed) == (T0 + minutes(60), 11)
    assert report.missed == 11 and len(report.started) == 1
    event = LoopEvent.objects.get(run_id=fire.run_id, type="trigger.missed")
    assert event.data == {
        "policy": "coalesce",
        "missed": 11,
        "at_least": False,
        "scheduled_for": "2030-01-07T10:00:00Z",
    }
    schedule = schedule_of(pattern)
    assert schedule.next_fire_at == T0 + minutes(65) and schedule.missed_total == 11


def test_after_downtime_skip_starts_nothing_and_waits_for_the_next_time() -> None:
    pattern = cron_pattern("*/5 * * * *", missed_fire_policy="skip")
    cron_schedule_sync(pattern, now=T0)
    report = cron_tick(now=T0 + minutes(62))
    assert fires_of(pattern) == [] and report.missed == 12
    assert schedule_of(pattern).next_fire_at == T0 + minutes(65)
    cron_tick(now=T0 + minutes(65) + timedelta(seconds=10))
    [fire] = fires_of(pattern)
    assert (fire.scheduled_for, fire.missed) == (T0 + minutes(65), 0)


def test_skip_still_fires_a_time_the_tick_is_only_a_little_late_for() -> None:
    pattern = cron_pattern("*/5 * * * *", missed_fire_policy="skip")
    cron_schedule_sync(pattern, now=T0)
    cron_tick(now=T0 + minutes(5) + timedelta(seconds=40))  # within the 60 s grace
    assert [f.scheduled_for for f in fires_of(pattern)] == [T0 + minutes(5)]


def test_a_month_of_downtime_on_an_every_minute_pattern_is_one_run() -> None:
    pattern = cron_pattern("* * * * *")
    cron_schedule_sync(pattern, now=T0)
    cron_tick(now=T0 + timedelta(days=30, seconds=30))
    [fire] = fires_of(pattern)
    assert fire.scheduled_for == T0 + timedelta(days=30) and fire.missed >= 999
    assert LoopEvent.objects.get(run_id=fire.run_id, type="trigger.missed").data["at_least"]


def test_a_disabled_pattern_is_paused_and_restarts_from_now_when_enabled() -> None:
    pattern = cron_pattern("*/5 * * * *")
    cron_schedule_sync(pattern, now=T0)
    LoopPattern.objects.filter(pk=pattern.pk).update(enabled=False)  # no hook: the tick notices
    cron_tick(now=T0 + minutes(30))
    schedule = schedule_of(pattern)
    assert schedule.next_fire_at is None and "disabled" in schedule.paused_reason
    assert fires_of(pattern) == []
    LoopPattern.objects.filter(pk=pattern.pk).update(enabled=True)
    cron_tick(now=T0 + minutes(31))
    assert schedule_of(pattern).next_fire_at == T0 + minutes(35)  # nothing from the pause
    assert fires_of(pattern) == []


def test_a_due_row_of_a_pattern_disabled_meanwhile_is_paused_not_fired() -> None:
    pattern = cron_pattern("*/5 * * * *")
    cron_schedule_sync(pattern, now=T0)
    LoopPattern.objects.filter(pk=pattern.pk).update(enabled=False)
    # The due row is claimed before the stale-pattern pass would pause it: both paths agree.
    with mock.patch.object(scheduler, "_stale_patterns", return_value=LoopPattern.objects.none()):
        cron_tick(now=T0 + minutes(5))
    assert fires_of(pattern) == [] and schedule_of(pattern).next_fire_at is None


def test_changing_the_expression_restarts_the_schedule_from_now() -> None:
    pattern = cron_pattern("0 * * * *")
    cron_schedule_sync(pattern, now=T0)
    LoopPattern.objects.filter(pk=pattern.pk).update(cron_expression="*/10 * * * *")
    cron_tick(now=T0 + minutes(12))
    assert schedule_of(pattern).next_fire_at == T0 + minutes(20)
    assert schedule_of(pattern).expression == "*/10 * * * *"


def test_the_hook_keeps_a_due_time_when_nothing_that_matters_changed() -> None:
    pattern = cron_pattern("*/5 * * * *")
    cron_schedule_sync(pattern, now=T0)
    pattern.title = "renamed"
    pattern.save(update_fields=["title"])
    cron_schedule_sync(pattern, now=T0 + minutes(7))  # 09:05 is due and not yet fired
    assert schedule_of(pattern).next_fire_at == T0 + minutes(5)
    cron_tick(now=T0 + minutes(7))
    assert [f.scheduled_for for f in fires_of(pattern)] == [T0 + minutes(5)]


def test_a_pattern_that_is_no_longer_cron_stops_firing() -> None:
    pattern = cron_pattern("*/5 * * * *")
    cron_schedule_sync(pattern, now=T0)
    LoopPattern.objects.filter(pk=pattern.pk).update(trigger_type="manual")
    cron_tick(now=T0 + minutes(5))
    assert fires_of(pattern) == []
    assert schedule_of(pattern).paused_reason == scheduler.NOT_CRON


def test_a_fire_the_pattern_refuses_is_recorded_with_the_reason_and_no_run() -> None:
    pattern = cron_pattern("*/5 * * * *", goal_template="Fix {{ inputs.path }}")
    cron_schedule_sync(pattern, now=T0)
    report = cron_tick(now=T0 + minutes(5))
    [fire] = fires_of(pattern)
    assert fire.outcome == "refused" and fire.run_id is None
    assert "could not be rendered" in fire.reason and "path" in fire.reason
    assert report.refused == 1 and LoopRun.objects.count() == 0
    assert schedule_of(pattern).next_fire_at == T0 + minutes(10)  # it moves on


def test_a_refusal_from_the_guard_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    pattern = cron_pattern("*/5 * * * *")
    cron_schedule_sync(pattern, now=T0)
    monkeypatch.setattr(scheduler, "trigger_refusal", lambda p: "circuit open (test)")
    cron_tick(now=T0 + minutes(5))
    [fire] = fires_of(pattern)
    assert (fire.outcome, fire.reason) == ("refused", "circuit open (test)")


def test_the_unique_fire_row_stops_a_second_start_of_the_same_time() -> None:
    pattern = cron_pattern("*/5 * * * *")
    decision = FireDecision(fire_at=T0 + minutes(5), missed=0, missed_capped=False)
    first, second = TickReport(now=T0), TickReport(now=T0)
    with transaction.atomic():
        scheduler._fire(pattern, decision, T0 + minutes(5), first)
    with transaction.atomic():
        scheduler._fire(pattern, decision, T0 + minutes(5), second)
    assert len(first.started) == 1 and second.started == [] and second.duplicates == 1
    assert LoopRun.objects.filter(pattern=pattern).count() == 1


def test_a_broken_pattern_is_logged_left_due_and_does_not_stop_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken, healthy = cron_pattern("*/5 * * * *"), cron_pattern("*/5 * * * *")
    for pattern in (broken, healthy):
        cron_schedule_sync(pattern, now=T0)
    real = scheduler._fire

    def fire(pattern: LoopPattern, *args: Any) -> None:
        if pattern.pk == broken.pk:
            raise RuntimeError("boom")
        real(pattern, *args)

    with mock.patch.object(scheduler, "_fire", side_effect=fire):
        report = cron_tick(now=T0 + minutes(5))
    assert report.errors == 1 and len(report.started) == 1
    assert schedule_of(broken).next_fire_at == T0 + minutes(5)  # retried at the next tick
    assert "pattern-" in caplog.text and "boom" in caplog.text


def test_the_tick_limit_leaves_the_rest_due_for_the_next_tick() -> None:
    patterns = [cron_pattern("*/5 * * * *") for _ in range(5)]
    for pattern in patterns:
        cron_schedule_sync(pattern, now=T0)
    assert cron_tick(now=T0 + minutes(5), limit=3).examined == 3
    assert cron_tick(now=T0 + minutes(5), limit=3).examined == 2
    assert CronFire.objects.count() == 5


def test_nudges_go_out_after_commit_and_never_with_an_eta(
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    pattern = cron_pattern("*/5 * * * *")
    cron_schedule_sync(pattern, now=T0)
    with (
        mock.patch("orchestrator.queue.app.send_task") as send,
        django_capture_on_commit_callbacks(execute=True),
    ):
        cron_tick(now=T0 + minutes(5))
    [fire] = fires_of(pattern)
    send.assert_called_once()
    assert send.call_args.args == ("loops.drive_run",)
    assert send.call_args.kwargs.get("args") == (str(fire.run_id),)
    assert not {"eta", "countdown"} & set(send.call_args.kwargs)


@pytest.mark.parametrize(
    ("zone", "expression", "start", "hours", "expected"),
    [
        # New York, fall back 2030-11-03: 01:30 happens twice, fires once (EDT).
        ("America/New_York", "30 1 * * *", datetime(2030, 11, 3, 4, tzinfo=UTC), 4,
         ["2030-11-03T05:30:00Z"]),
        # New York, spring forward 2030-03-10: 02:30 does not exist, fires at 03:00 EDT.
        ("America/New_York", "30 2 * * *", datetime(2030, 3, 10, 5, tzinfo=UTC), 4,
         ["2030-03-10T07:00:00Z"]),
        # Berlin, fall back 2030-10-27: hourly, the repeated 02:00 fires once.
        ("Europe/Berlin", "0 * * * *", datetime(2030, 10, 26, 22, 30, tzinfo=UTC), 4,
         ["2030-10-26T23:00:00Z", "2030-10-27T00:00:00Z", "2030-10-27T02:00:00Z"]),
        # Berlin, spring forward 2030-03-31: hourly, no 02:00.
        ("Europe/Berlin", "0 * * * *", datetime(2030, 3, 30, 23, 30, tzinfo=UTC), 3,
         ["2030-03-31T00:00:00Z", "2030-03-31T01:00:00Z", "2030-03-31T02:00:00Z"]),
    ],
)  # fmt: skip
def test_ticking_through_a_dst_change_fires_each_wall_time_once(
    zone: str, expression: str, start: datetime, hours: int, expected: list[str]
) -> None:
    pattern = cron_pattern(expression, timezone=zone)
    cron_schedule_sync(pattern, now=start)
    for tick in range(1, hours * 30 + 1):  # every two minutes: each fire is on time
        cron_tick(now=start + minutes(2 * tick))
    got = [f.scheduled_for.isoformat().replace("+00:00", "Z") for f in fires_of(pattern)]
    assert got == expected
    assert all(f.missed == 0 and f.outcome == "started" for f in fires_of(pattern))


def test_beat_sends_one_static_tick_and_the_task_rescans_once_a_minute(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from loops import tasks
    from orchestrator.celery import app

    entry = app.conf.beat_schedule["loops.cron_tick"]
    assert entry["task"] == "loops.cron_tick" and float(entry["schedule"]) > 0
    assert not {"eta", "countdown"} & set(entry.get("options", {}))
    calls: list[bool] = []
    monkeypatch.setattr(
        scheduler, "cron_tick", lambda *, resync: calls.append(resync) or TickReport(now=T0)
    )
    monkeypatch.setattr(tasks, "_last_cron_resync", [-1e9])
    tasks.cron_tick()
    tasks.cron_tick()
    assert calls == [True, False]

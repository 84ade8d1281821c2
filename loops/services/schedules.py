"""A cron pattern's schedule row, kept in step with the pattern.

One ``CronSchedule`` row per cron pattern holds its next fire time (docs/triggers.md). Every
save of a pattern calls :func:`cron_schedule_sync`; the scheduler's tick calls it too for rows
that are missing or stale, so schedules heal without the hook.
"""

from __future__ import annotations

from datetime import datetime

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from loops.cron import CronInvalid, CronSpec, next_fire_after
from loops.models import CronSchedule, LoopPattern, TriggerType

NOT_CRON = "The pattern is not a cron pattern."
DISABLED = "The pattern is disabled; times missed while disabled are not run."
NO_LATER_TIME = "The cron expression names no later time."


def db_now() -> datetime:
    """The database's clock, so schedulers on different hosts agree on what is due."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            value = cursor.fetchone()
        assert value is not None
        moment: datetime = value[0]
        return moment
    return timezone.now()


def spec_of(pattern: LoopPattern) -> CronSpec:
    return CronSpec(pattern.cron_expression, pattern.timezone or "UTC", hash_id=pattern.key)


def pause_reason(pattern: LoopPattern) -> str:
    if pattern.trigger_type != TriggerType.CRON:
        return NOT_CRON
    if not pattern.enabled:
        return DISABLED
    return ""


def schedule_in_step(schedule: CronSchedule, pattern: LoopPattern) -> bool:
    """Was the row computed from the pattern as it is now?"""
    return (
        schedule.expression == pattern.cron_expression
        and schedule.timezone == pattern.timezone
        and schedule.enabled == pattern.enabled
        and (schedule.paused_reason == NOT_CRON) == (pattern.trigger_type != TriggerType.CRON)
    )


def schedule_recompute(schedule: CronSchedule, pattern: LoopPattern, now: datetime) -> None:
    """Start the schedule afresh from ``now``: earlier times (while paused or under another
    expression) are not run."""
    schedule.expression = pattern.cron_expression
    schedule.timezone = pattern.timezone
    schedule.enabled = pattern.enabled
    schedule.paused_reason = pause_reason(pattern)
    schedule.next_fire_at = None
    if schedule.paused_reason:
        return
    try:
        schedule.next_fire_at = next_fire_after(spec_of(pattern), now)
    except CronInvalid as exc:
        schedule.paused_reason = str(exc)[:200]
        return
    if schedule.next_fire_at is None:
        schedule.paused_reason = NO_LATER_TIME


def schedule_new(pattern: LoopPattern, *, now: datetime) -> CronSchedule:
    """An unsaved schedule row for a cron pattern, starting after ``now`` (bulk seeding)."""
    schedule = CronSchedule(pattern=pattern)
    schedule_recompute(schedule, pattern, now)
    return schedule


#: The columns :func:`cron_schedule_sync` writes.
SYNC_FIELDS = ["expression", "timezone", "enabled", "paused_reason", "next_fire_at", "updated_at"]


@transaction.atomic
def cron_schedule_sync(pattern: LoopPattern, *, now: datetime | None = None) -> CronSchedule | None:
    """Bring the pattern's schedule row in line with the pattern; call it after every save.

    A new cron pattern gets a row with its first fire time after ``now``. A change of the
    expression, the time zone, ``enabled`` or the trigger type restarts the schedule from
    ``now`` (a disabled or non-cron pattern's row is paused: ``next_fire_at`` NULL). Any other
    change keeps the row as it is, so editing a title never loses a due fire. Returns the row,
    or None for a pattern that is not cron and never had one. The tick also calls this for
    patterns whose row is missing or stale, so schedules heal without the hook.
    """
    now = now or db_now()
    schedule = CronSchedule.objects.select_for_update().filter(pattern=pattern).first()
    if schedule is None:
        if pattern.trigger_type != TriggerType.CRON:
            return None
        schedule = schedule_new(pattern, now=now)
        try:
            with transaction.atomic():
                schedule.save(force_insert=True)
        except IntegrityError:  # another process created it meanwhile: theirs is as good
            return CronSchedule.objects.get(pattern=pattern)
        return schedule
    if not schedule_in_step(schedule, pattern):
        schedule_recompute(schedule, pattern, now)
        schedule.save(update_fields=SYNC_FIELDS)
    return schedule

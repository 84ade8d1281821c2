"""The cron scheduler: one periodic tick that fires every due cron pattern exactly once.

Celery beat sends ``loops.cron_tick`` every few seconds (``LOOPWRIGHT_CRON_TICK_SECONDS``); the
tick claims due ``CronSchedule`` rows, records each fire as a ``CronFire`` row (unique per
pattern and scheduled time) and starts the run in the same transaction, then moves the schedule
to its next fire time. Nothing is scheduled with Celery ETAs (docs/reliability.md §1): the database
holds every due time, so a tick that is lost, late or doubled changes nothing but latency.

Two ticks at once (two beat processes, a tick that overruns the next one): on PostgreSQL each
claims its rows with ``FOR UPDATE SKIP LOCKED``, on SQLite the IMMEDIATE write transactions
serialise them, and the unique constraint of ``CronFire`` is the final guard either way.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from loops.cron import (
    CronInvalid,
    FireDecision,
    due_fires,
    fire_decision,
    next_fire_after,
    next_fires,
)
from loops.models import (
    CronFire,
    CronFireOutcome,
    CronSchedule,
    LoopPattern,
    LoopRun,
    TriggerType,
)
from loops.services.runs import run_trigger
from loops.services.schedules import (
    NO_LATER_TIME,
    NOT_CRON,
    SYNC_FIELDS,
    cron_schedule_sync,
    db_now,
    pause_reason,
    schedule_in_step,
    schedule_recompute,
    spec_of,
)
from loops.services.transitions import run_event_append
from loops.triggers.guards import trigger_refusal
from orchestrator.errors import DomainError

logger = logging.getLogger(__name__)
SCHEDULER_ACTOR = "scheduler"
#: Schedule rows claimed and handled per transaction.
BATCH_SIZE = 100


def scheduler_id() -> str:
    """host:pid of this process (computed per call: Celery forks after importing modules)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def grace() -> timedelta:
    """How late a tick may run and still count a due time as on time (``skip`` policy)."""
    seconds = settings.LOOPWRIGHT.get("CRON_GRACE_SECONDS", 60.0)
    return timedelta(seconds=float(seconds))


def _stale_patterns() -> QuerySet[LoopPattern]:
    """Cron patterns whose schedule row is missing or was computed from other values."""
    stale = (
        Q(cron_schedule__isnull=True)
        | ~Q(cron_schedule__expression=F("cron_expression"))
        | ~Q(cron_schedule__timezone=F("timezone"))
        | ~Q(cron_schedule__enabled=F("enabled"))
        | Q(cron_schedule__paused_reason=NOT_CRON)
    )
    return LoopPattern.objects.filter(trigger_type=TriggerType.CRON).filter(stale).order_by()


@dataclass
class TickReport:
    """What one tick did. ``duplicates`` counts fires another scheduler had already recorded."""

    now: datetime
    synced: int = 0
    examined: int = 0
    started: list[uuid.UUID] = field(default_factory=list)
    refused: int = 0
    duplicates: int = 0
    missed: int = 0
    errors: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "now": self.now.isoformat(),
            "synced": self.synced,
            "examined": self.examined,
            "started": len(self.started),
            "refused": self.refused,
            "duplicates": self.duplicates,
            "missed": self.missed,
            "errors": self.errors,
        }


def cron_tick(*, now: datetime | None = None, limit: int = 2000, resync: bool = True) -> TickReport:
    """Fire every cron pattern that is due at ``now`` (default: the database clock).

    ``resync`` first repairs schedule rows that are missing or stale (a pattern saved without
    the ``cron_schedule_sync`` hook); it scans every cron pattern, so the periodic task does it
    about once a minute rather than at every tick. Handles at most ``limit`` due schedules (the
    rest stay due for the next tick) in transactions of ``BATCH_SIZE``. A schedule whose
    handling fails unexpectedly is logged and left due, so the next tick retries it; the others
    go on.
    """
    now = now or db_now()
    report = TickReport(now=now)
    if resync:
        for pattern in _stale_patterns()[:limit]:
            cron_schedule_sync(pattern, now=now)
            report.synced += 1
    failed: set[int] = set()
    while report.examined < limit:
        size = min(BATCH_SIZE, limit - report.examined)
        if _tick_batch(now, size, failed, report) < size:
            break  # nothing more is due, or the rest is being handled by another scheduler
    return report


def _claim_due(now: datetime, size: int, failed: set[int]) -> list[CronSchedule]:
    due = (
        CronSchedule.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("pattern")
        .filter(next_fire_at__lte=now)
        .exclude(pk__in=failed)
        .order_by("next_fire_at", "pk")
    )
    return list(due[:size])


def _tick_batch(now: datetime, size: int, failed: set[int], report: TickReport) -> int:
    with transaction.atomic():
        schedules = _claim_due(now, size, failed)
        for schedule in schedules:
            report.examined += 1
            try:
                with transaction.atomic():
                    _tick_schedule(schedule, now, report)
            except Exception:  # isolate one broken pattern; it stays due and is retried
                logger.exception("cron tick: pattern %s failed", schedule.pattern.key)
                failed.add(schedule.pk)
                report.errors += 1
    return len(schedules)


def _tick_schedule(schedule: CronSchedule, now: datetime, report: TickReport) -> None:
    pattern = schedule.pattern
    if not schedule_in_step(schedule, pattern) or pause_reason(pattern):
        schedule_recompute(schedule, pattern, now)
        schedule.save(update_fields=SYNC_FIELDS)
        report.synced += 1
        return
    assert schedule.next_fire_at is not None
    due = due_fires(spec_of(pattern), schedule.next_fire_at, now)
    decision = fire_decision(due, policy=pattern.missed_fire_policy, now=now, grace=grace())
    if decision.fire_at is not None:
        _fire(pattern, decision, now, report)
        schedule.last_fired_at = decision.fire_at
    report.missed += decision.missed
    schedule.missed_total += decision.missed
    schedule.next_fire_at = due.next_after
    schedule.paused_reason = "" if due.next_after is not None else NO_LATER_TIME
    schedule.save(
        update_fields=[
            "next_fire_at",
            "last_fired_at",
            "missed_total",
            "paused_reason",
            "updated_at",
        ]
    )


def _fire(pattern: LoopPattern, decision: FireDecision, now: datetime, report: TickReport) -> None:
    """Record the fire, then start its run; both commit or neither does."""
    assert decision.fire_at is not None
    fire = CronFire(
        pattern=pattern,
        scheduled_for=decision.fire_at,
        fired_at=now,
        outcome=CronFireOutcome.STARTED,
        missed=decision.missed,
        scheduler=scheduler_id(),
    )
    try:
        with transaction.atomic():
            fire.save(force_insert=True)
    except IntegrityError:  # another scheduler recorded this very fire: it is theirs
        report.duplicates += 1
        return
    run, refusal = _start_run(pattern, decision)
    if run is None:
        fire.outcome, fire.reason = CronFireOutcome.REFUSED, refusal
        fire.save(update_fields=["outcome", "reason"])
        report.refused += 1
        logger.info("cron: %s refused the fire at %s: %s", pattern.key, fire.scheduled_for, refusal)
        return
    fire.run = run
    fire.save(update_fields=["run"])
    report.started.append(run.id)


def _cron_event(decision: FireDecision) -> dict[str, Any]:
    """What the goal template sees as ``event`` for a cron run."""
    assert decision.fire_at is not None
    return {
        "trigger": "cron",
        "scheduled_for": iso(decision.fire_at),
        "missed": decision.missed,
    }


def _start_run(pattern: LoopPattern, decision: FireDecision) -> tuple[LoopRun | None, str]:
    refusal = trigger_refusal(pattern)
    if refusal:
        return None, refusal
    assert decision.fire_at is not None
    try:
        with transaction.atomic():  # a refusal must leave no half-made run behind
            run = run_trigger(
                pattern=pattern,
                actor=SCHEDULER_ACTOR,
                trigger_type=TriggerType.CRON,
                trigger_ref=iso(decision.fire_at),
                event=_cron_event(decision),
            )
    except DomainError as exc:  # the template, the harness or the pattern refused
        return None, exc.detail
    if decision.missed:
        run_event_append(
            run_id=run.id,
            type="trigger.missed",
            actor=SCHEDULER_ACTOR,
            data={
                "policy": pattern.missed_fire_policy,
                "missed": decision.missed,
                "at_least": decision.missed_capped,
                "scheduled_for": iso(decision.fire_at),
            },
        )
    return run, ""


def iso(moment: datetime) -> str:
    """RFC 3339 in UTC with a ``Z``."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def pattern_schedule(pattern: LoopPattern, *, now: datetime | None = None) -> dict[str, Any]:
    """The schedule of a pattern as the API shows it: next fire time, the five next ones,
    the last fire and the recent fires with their outcome."""
    now = now or timezone.now()
    schedule = CronSchedule.objects.filter(pattern=pattern).first()
    upcoming, reason = _upcoming(pattern, schedule, now)
    fires = CronFire.objects.filter(pattern=pattern).order_by("-scheduled_for")[:10]
    return {
        "pattern": pattern.key,
        "trigger_type": pattern.trigger_type,
        "cron_expression": pattern.cron_expression,
        "timezone": pattern.timezone,
        "missed_fire_policy": pattern.missed_fire_policy,
        "enabled": pattern.enabled,
        "next_fire_at": iso(upcoming[0]) if upcoming else None,
        "next_fires": [iso(moment) for moment in upcoming],
        "paused_reason": reason,
        "last_fired_at": iso(schedule.last_fired_at)
        if schedule and schedule.last_fired_at
        else None,
        "missed_total": schedule.missed_total if schedule else 0,
        "recent_fires": [_fire_view(fire) for fire in fires],
    }


def _upcoming(
    pattern: LoopPattern, schedule: CronSchedule | None, now: datetime
) -> tuple[list[datetime], str]:
    reason = pause_reason(pattern)
    if reason:
        return [], reason
    spec = spec_of(pattern)
    try:
        if schedule is not None and schedule_in_step(schedule, pattern) and schedule.next_fire_at:
            # A due time the tick has not handled yet is still the next fire.
            return [schedule.next_fire_at, *next_fires(spec, schedule.next_fire_at, 4)], ""
        upcoming = next_fires(spec, now, 5)
    except CronInvalid as exc:
        return [], str(exc)
    return upcoming, "" if upcoming else NO_LATER_TIME


def pattern_next_fire_at(pattern: LoopPattern) -> datetime | None:
    """The next fire time of a cron pattern (None when it is paused or not cron).

    Reads the schedule row only (no cron arithmetic), so a list of patterns costs one join.
    """
    if pause_reason(pattern):
        return None
    schedule: CronSchedule | None = getattr(pattern, "cron_schedule", None)
    if schedule is None or not schedule_in_step(schedule, pattern):
        try:
            return next_fire_after(spec_of(pattern), timezone.now())
        except CronInvalid:
            return None
    return schedule.next_fire_at


def _fire_view(fire: CronFire) -> dict[str, Any]:
    return {
        "scheduled_for": iso(fire.scheduled_for),
        "fired_at": iso(fire.fired_at),
        "outcome": fire.outcome,
        "reason": fire.reason,
        "run": str(fire.run_id) if fire.run_id else None,
        "missed": fire.missed,
    }

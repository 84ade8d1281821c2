"""Thin Celery tasks. Names are explicit and never renamed; arguments are JSON.

``loops.drive_run`` is a nudge: it hands the run id to this process's run driver and returns
at once. The driver claims the run in the database; if another worker already holds it, the
nudge is a no-op (docs/reliability.md D6).
"""

from __future__ import annotations

import logging
import uuid
from time import monotonic
from typing import Any

from celery import shared_task
from celery.signals import worker_ready, worker_shutting_down

from loops.services.approvals import approvals_expire
from loops.services.checkpoints import checkpoints_prune
from loops.services.claims import runs_reap
from loops.services.notifications import deliver_approval_notifications
from loops.services.retention import events_prune
from loops.services.spans import spans_sweep
from loops.triggers import scheduler
from loops.worker.driver import get_driver, stop_driver
from orchestrator.heap import freeze_startup_heap

logger = logging.getLogger(__name__)


@shared_task(name="loops.drive_run", ignore_result=True, time_limit=30, acks_late=False)
def drive_run(run_id: str) -> None:
    try:
        parsed = uuid.UUID(run_id)
    except ValueError:
        logger.warning("ignoring nudge with a malformed run id %r", run_id)
        return
    driver = get_driver()
    if driver is None:
        logger.info("ignoring nudge for run %s: this worker is shutting down", run_id)
        return
    driver.submit(parsed)


@shared_task(name="loops.reap", ignore_result=True, time_limit=120, expires=30)
def reap() -> None:
    approvals_expire()
    report = runs_reap()
    if report.requeued or report.failed or report.locks_freed:
        logger.info(
            "reaper: %d re-queued, %d failed, %d locks freed",
            len(report.requeued),
            len(report.failed),
            report.locks_freed,
        )


@shared_task(name="loops.spans_sweep", ignore_result=True, time_limit=300, expires=60)
def spans_sweep_task() -> None:
    """Store (and export) the spans of ended runs, prune those past retention."""
    report = spans_sweep()
    if report.recorded or report.pruned:
        stored = (report.recorded, report.spans, report.pruned)
        logger.info("spans: %d runs stored (%d spans), %d pruned", *stored)


@shared_task(name="loops.events_prune", ignore_result=True, time_limit=300, expires=300)
def events_prune_task() -> None:
    """Prune the events of runs ended past the retention, a minute of batches at most, and
    drop the conversation checkpoints of ended runs."""
    dropped = checkpoints_prune()
    if dropped:
        logger.info("checkpoints: %d of ended runs dropped", dropped)
    report = events_prune(budget_seconds=60.0)
    if report.runs:
        more = " (more due: the next sweep goes on)" if report.more else ""
        logger.info("events: %d pruned of %d ended runs%s", report.events, report.runs, more)


@shared_task(name="loops.notify_approvals", ignore_result=True, time_limit=60)
def notify_approvals_task(approval_ids: list[str]) -> None:
    deliver_approval_notifications(approval_ids)


@worker_ready.connect
def _start_driver(sender: Any = None, **kwargs: Any) -> None:
    """Start polling for due runs as soon as the worker is up, not at the first nudge; then
    keep what the process loaded out of later garbage collections (``orchestrator.heap``)."""
    # A worker of other queues only (a skills worker: ``-Q skills``) drives no runs.
    consumed = getattr(getattr(getattr(sender, "app", None), "amqp", None), "queues", None)
    names = set((getattr(consumed, "consume_from", None) or {}).keys())
    if not names or "loops" in names:
        get_driver()
    freeze_startup_heap()


@worker_shutting_down.connect
def _drain_driver(sender: Any = None, **kwargs: Any) -> None:
    """SIGTERM: stop claiming, let runs finish for the drain period, release the rest."""
    stop_driver()


_last_cron_resync = [-1e9]


@shared_task(name="loops.cron_tick", ignore_result=True, time_limit=120, soft_time_limit=110)
def cron_tick() -> None:
    """Fire the due cron patterns (beat sends this every ``LOOPWRIGHT_CRON_TICK_SECONDS``).

    Safe to run twice at once or to lose: due times live in the database, not in the message.
    The scan for stale schedule rows runs at most once a minute per worker process.
    """
    resync = monotonic() - _last_cron_resync[0] >= 60
    if resync:
        _last_cron_resync[0] = monotonic()
    report = scheduler.cron_tick(resync=resync)
    if report.started or report.refused or report.errors or report.missed or report.synced:
        logger.info("cron tick: %s", report.as_dict())

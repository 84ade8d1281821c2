"""Event retention: the events of runs that ended longer ago than
``LOOPWRIGHT_EVENT_RETENTION_DAYS`` are deleted, all but each run's ``run.created`` (which holds
what the trigger asked for and the harness notices); the run row, its steps, approvals and
stored spans stay, and ``events_pruned_at`` says when.

Holds: only ended runs (succeeded, failed, canceled) are touched, and none whose spans the sweep
may still store from its events (only those stored already, or created before the sweep's
window). Each batch is its own short transaction over at most :data:`BATCH_RUNS` runs, taken
with ``SKIP LOCKED``: two prunes never wait for each other and the engine, which never writes
an ended run, is never held up (docs/operations.md, Retention). Pruning twice is a no-op.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from loops import state
from loops.models import LoopEvent, LoopRun
from loops.services.spans import SWEEP_WINDOW
from orchestrator.sql import is_postgres

#: Runs whose events one transaction deletes (about 50 events each in a typical run).
BATCH_RUNS = 100


@dataclass(frozen=True)
class PruneReport:
    runs: int = 0
    events: int = 0
    #: True when the time budget ran out with runs still due (the next sweep goes on).
    more: bool = False


def retention_days() -> float:
    return float(settings.LOOPWRIGHT.get("EVENT_RETENTION_DAYS") or 0.0)


def events_prune_batch(
    *, before: datetime, now: datetime | None = None, batch_runs: int = BATCH_RUNS
) -> tuple[int, int]:
    """Prune the events of at most ``batch_runs`` runs that ended before ``before``, in one
    transaction; returns (runs, events deleted)."""
    terminal = [s.value for s in state.TERMINAL]
    now = now or timezone.now()
    with transaction.atomic():
        due = (
            LoopRun.objects.filter(
                finished_at__lt=before, events_pruned_at__isnull=True, status__in=terminal
            )
            .filter(Q(span_record__isnull=False) | Q(created_at__lt=now - SWEEP_WINDOW))
            .order_by("finished_at")
            .values_list("id", flat=True)
        )
        if is_postgres():
            due = due.select_for_update(skip_locked=True, of=("self",))
        run_ids = list(due[:batch_runs])
        if not run_ids:
            return 0, 0
        deleted, _ = LoopEvent.objects.filter(run_id__in=run_ids, seq__gt=1).delete()
        LoopRun.objects.filter(id__in=run_ids).update(events_pruned_at=now)
    return len(run_ids), deleted


def events_prune(
    *,
    now: datetime | None = None,
    days: float | None = None,
    budget_seconds: float = 60.0,
    pause_seconds: float = 0.02,
) -> PruneReport:
    """Batches until nothing is due or ``budget_seconds`` are spent, pausing between them so
    the database serves the engine in between. Nothing when the retention is 0 (keep)."""
    days = retention_days() if days is None else days
    if days <= 0:
        return PruneReport()
    now = now or timezone.now()
    before = now - timedelta(days=days)
    deadline = time.monotonic() + budget_seconds
    runs = events = 0
    while True:
        pruned, deleted = events_prune_batch(before=before, now=now)
        runs, events = runs + pruned, events + deleted
        if pruned < BATCH_RUNS:
            return PruneReport(runs, events, more=False)
        if time.monotonic() >= deadline:
            return PruneReport(runs, events, more=True)
        time.sleep(pause_seconds)

"""What the run engine's tables say at scrape time, as Prometheus gauges (docs/observability.md):
runs in each live status, the claim queue's depth, approvals pending and the oldest one's age.
Two queries, both served by partial or status indexes; registered in ``LoopsConfig.ready``."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import Count, Min, Q
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from loops import state
from loops.models import ActionApproval, ApprovalStatus, LoopRun, RunStatus

#: Live statuses only: a terminal run never leaves, so their totals are the counter
#: ``loopwright_runs_ended_total`` (a count over every run ever would grow with the table).
_LIVE = [s for s in RunStatus if s not in state.TERMINAL]
_CLAIMABLE = {s.value for s in state.CLAIMABLE}


def _runs(now_due: Q) -> Iterable[Metric]:
    rows = (
        LoopRun.objects.filter(status__in=_LIVE)
        .values("status")
        .annotate(n=Count("id"), due=Count("id", filter=now_due & Q(lease_owner__isnull=True)))
        .order_by()
    )
    found = {row["status"]: row for row in rows}
    runs = GaugeMetricFamily(
        "loopwright_runs", "Runs now in each live (non-terminal) status.", labels=["status"]
    )
    for status in _LIVE:
        runs.add_metric([status.value], found.get(status.value, {}).get("n", 0))
    depth = sum(row["due"] for status, row in found.items() if status in _CLAIMABLE)
    queue = GaugeMetricFamily(
        "loopwright_run_queue_depth", "Runs due to be claimed by a worker and not yet claimed."
    )
    queue.add_metric([], depth)
    return [runs, queue]


def _approvals() -> Iterable[Metric]:
    pending = ActionApproval.objects.filter(status=ApprovalStatus.PENDING).aggregate(
        n=Count("id"), oldest=Min("created_at")
    )
    count = GaugeMetricFamily("loopwright_approvals_pending", "Approvals waiting for a person.")
    count.add_metric([], pending["n"])
    age = GaugeMetricFamily(
        "loopwright_approval_oldest_pending_age_seconds",
        "How long the oldest pending approval has waited (0 when none is pending).",
    )
    oldest = pending["oldest"]
    age.add_metric([], (timezone.now() - oldest).total_seconds() if oldest else 0.0)
    return [count, age]


def engine_state_collect() -> Iterable[Metric]:
    """The run engine's gauges, read now (the web process's ``/metrics``)."""
    now = timezone.now()
    due = Q(not_before__isnull=True) | Q(not_before__lte=now)
    return [*_runs(due), *_approvals()]

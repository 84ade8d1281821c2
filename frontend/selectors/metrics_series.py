"""Per-day series of the Metrics page's charts, over the window's UTC days (zeros filled in).

Read from the tables the engine writes anyway: runs by the day they were created and their
status now; approvals by the day they were decided (the median wait that day); model tokens
(in + out) and cost from the budgets' day buckets (``metrics_usage``); model failures by
endpoint, from the failed model steps and from the endpoint failures that made a run wait
(``run.retry_later``; every retried attempt is counted by Prometheus as
``loopwright_model_errors`` instead).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from datetime import date, datetime
from typing import Any

from django.db.models import Count, QuerySet
from django.db.models.functions import TruncDate

from frontend.selectors.metrics import WAIT_SAMPLE
from frontend.selectors.metrics_usage import DayUsage
from loops.models import ActionApproval, LoopEvent, LoopRun, LoopStep, RunStatus

#: How runs are grouped in the runs chart: the three ends, and everything not ended yet.
RUN_GROUPS: dict[str, str] = {
    RunStatus.SUCCEEDED.value: "succeeded",
    RunStatus.FAILED.value: "failed",
    RunStatus.CANCELED.value: "canceled",
}
NOT_ENDED = "not ended"
#: Endpoints drawn apart in the errors chart; the others are summed as "other".
TOP_ENDPOINTS = 5
#: Failure records read for the errors chart (newest first), to bound the page's cost.
ERROR_SAMPLE = 5000

#: The tokens chart's one series: a bucket sums prompt and completion tokens.
TOKENS = "tokens (in + out)"

Series = dict[str, list[float]]


def _by_day(days: list[date], counts: dict[tuple[date, str], float], names: list[str]) -> Series:
    return {name: [float(counts.get((day, name), 0)) for day in days] for name in names}


def status_per_day(
    rows: QuerySet[Any], days: list[date], group: Callable[[str], str], names: list[str]
) -> Series:
    """Rows (with ``created_at`` and ``status``) counted per UTC day of creation and per
    ``group(status)``; one grouped query."""
    per_day = (
        rows.annotate(day=TruncDate("created_at"))
        .values("day", "status")
        .annotate(n=Count("id"))
        .values_list("day", "status", "n")
    )
    counts: Counter[tuple[date, str]] = Counter()
    for day, status, n in per_day:
        counts[(day, group(status))] += n
    return _by_day(days, dict(counts), names)


def runs_per_day(days: list[date], since: datetime) -> Series:
    return status_per_day(
        LoopRun.objects.filter(created_at__gte=since),
        days,
        lambda status: RUN_GROUPS.get(status, NOT_ENDED),
        [*RUN_GROUPS.values(), NOT_ENDED],
    )


def approval_wait_per_day(days: list[date], since: datetime) -> Series:
    """The median wait (seconds) of the approvals decided each day."""
    rows = (
        ActionApproval.objects.filter(decided_at__isnull=False, decided_at__gte=since)
        .order_by("-decided_at")
        .values_list("created_at", "decided_at")[:WAIT_SAMPLE]
    )
    waits: dict[date, list[float]] = defaultdict(list)
    for asked, decided in rows:
        if decided is None:  # excluded by the filter; for the type checker
            continue
        waits[decided.date()].append(max((decided - asked).total_seconds(), 0.0))
    medians = {(day, "median wait"): statistics.median(v) for day, v in waits.items()}
    return _by_day(days, medians, ["median wait"])


def usage_series(days: list[date], usage: Iterable[DayUsage]) -> tuple[Series, Series]:
    """(tokens in + out, cost) per day, from :func:`metrics_usage.usage_per_day`."""
    tokens: dict[tuple[date, str], float] = {}
    cost: dict[tuple[date, str], float] = {}
    for row in usage:
        tokens[(row.day, TOKENS)] = row.tokens
        cost[(row.day, "cost")] = float(row.cost)
    return _by_day(days, tokens, [TOKENS]), _by_day(days, cost, ["cost"])


def _failures(since: datetime) -> list[tuple[date, str]]:
    found: list[tuple[date, str]] = []
    steps = (
        LoopStep.objects.filter(kind="model", started_at__gte=since)
        .exclude(error="")
        .order_by("-started_at")
        .values_list("started_at", "response", "request")[:ERROR_SAMPLE]
    )
    for at, response, request in steps:
        endpoint = (response or {}).get("endpoint") or (request or {}).get("route") or "?"
        found.append((at.date(), str(endpoint)))
    waits = (
        LoopEvent.objects.filter(type="run.retry_later", created_at__gte=since)
        .order_by("-created_at")
        .values_list("created_at", "data")[:ERROR_SAMPLE]
    )
    for at, data in waits:
        data = data if isinstance(data, dict) else {}
        if data.get("kind") != "model":
            continue
        failures: list[Any] = data.get("failures") or [{"endpoint": data.get("endpoint")}]
        found += [(at.date(), str((f or {}).get("endpoint") or "?")) for f in failures]
    return found


def model_errors_per_day(days: list[date], since: datetime) -> Series:
    """Model failures per day, by endpoint (the :data:`TOP_ENDPOINTS` most failing apart)."""
    failures = _failures(since)
    top = [name for name, _ in Counter(e for _, e in failures).most_common(TOP_ENDPOINTS)]
    counts: Counter[tuple[date, str]] = Counter(
        (day, endpoint if endpoint in top else "other") for day, endpoint in failures
    )
    names = top + (["other"] if any(k[1] == "other" for k in counts) else [])
    return _by_day(days, dict(counts), names)

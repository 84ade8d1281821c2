"""The Metrics page (``/ui/metrics``): a small, read-only summary of how the loops are doing.
``/metrics`` itself is the Prometheus exposition (``orchestrator/metrics_view.py``)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from frontend.access import ui_view
from frontend.charts import Chart, stacked_bars
from frontend.selectors import metrics_series as series
from frontend.selectors import skill_usage
from frontend.selectors.metrics import Metrics, metrics_summary
from frontend.selectors.metrics_usage import usage_days
from frontend.templatetags.ui import seconds

#: The windows the page offers (days); anything else falls back to the default.
WINDOWS = (1, 7, 14, 30, 90)
DEFAULT_WINDOW = 14


@ui_view()
def metrics(request: HttpRequest) -> HttpResponse:
    try:
        days = int(request.GET.get("days", DEFAULT_WINDOW))
    except ValueError:
        days = DEFAULT_WINDOW
    if days not in WINDOWS:
        days = DEFAULT_WINDOW
    summary = metrics_summary(days)
    context = {
        "metrics": summary,
        "windows": WINDOWS,
        "charts": charts(summary),
        "skills": skill_usage.skill_usage(summary.since),
    }
    return render(request, "frontend/metrics.html", context)


def wait_text(value: float) -> str:
    """An axis or tooltip wait: ``0.5s``, ``42s``, ``4m``."""
    return f"{value:g}s" if value < 60 else seconds(value)


def charts(summary: Metrics) -> dict[str, Chart]:
    """The page's charts over its window, one bar per UTC day."""
    days = usage_days(summary.since, timezone.now())
    tokens, cost = series.usage_series(days, summary.usage)
    return {
        "runs": stacked_bars(
            "Runs created per day, by status now", days, series.runs_per_day(days, summary.since)
        ),
        "waits": stacked_bars(
            "Median approval wait of the approvals decided each day",
            days,
            series.approval_wait_per_day(days, summary.since),
            fmt=wait_text,
        ),
        "tokens": stacked_bars("Model tokens (in + out) per day", days, tokens),
        "cost": stacked_bars("Model cost per day", days, cost, fmt=lambda v: f"{v:.4f}"),
        "errors": stacked_bars(
            "Model failures per day, by endpoint",
            days,
            series.model_errors_per_day(days, summary.since),
        ),
        "skills": stacked_bars(
            "Skill calls per day, by outcome",
            days,
            skill_usage.skill_calls_per_day(days, summary.since),
        ),
    }

"""The Metrics page (``/ui/metrics``): a small, read-only summary of how the loops are doing.
``/metrics`` itself is the Prometheus exposition (``orchestrator/metrics_view.py``)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from frontend.access import ui_view
from frontend.selectors.metrics import metrics_summary

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
    context = {"metrics": metrics_summary(days), "windows": WINDOWS}
    return render(request, "frontend/metrics.html", context)

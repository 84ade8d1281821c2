"""The Metrics page's charts: SVG bars drawn on the server from the engine's tables, one per
UTC day of the window, each segment with its figure as a tooltip; the geometry is a pure
function (``frontend.charts``)."""

from __future__ import annotations

import html as html_module
from collections.abc import Callable
from datetime import date, timedelta

import pytest
from django.test import Client
from django.utils import timezone

from frontend.charts import nice_ceiling, stacked_bars
from loops.models import LoopEvent, LoopRun, LoopStep, RunStatus
from tests.support.factories import make_pattern, make_run
from tests.support.usage import charge

ClientAs = Callable[[str], Client]


def test_bars_stack_in_order_on_a_rounded_axis() -> None:
    days = [date(2026, 12, 1), date(2026, 12, 2)]
    chart = stacked_bars("t", days, {"ok": [3, 0], "bad": [4, 1]})
    assert [nice_ceiling(v) for v in (0, 7, 13, 0.3)] == [1.0, 10.0, 20.0, 0.5]
    titles = [s.title for s in chart.segments]
    assert titles == ["2026-12-01 · ok: 3", "2026-12-01 · bad: 4", "2026-12-02 · bad: 1"]
    ok, bad, _ = chart.segments
    assert bad.y + bad.height == pytest.approx(ok.y)  # stacked on top of the first
    assert ok.height / 3 == pytest.approx(bad.height / 4)
    assert [t.text for t in chart.y_ticks] == ["0", "5", "10"] and not chart.empty
    with pytest.raises(ValueError, match="series 'ok' has 1 values for 2 days"):
        stacked_bars("t", days, {"ok": [1]})


@pytest.mark.django_db
def test_the_metrics_page_draws_runs_waits_usage_and_failures(client_as: ClientAs) -> None:
    pattern = make_pattern()
    done = make_run(pattern, status=RunStatus.SUCCEEDED)
    make_run(pattern, status=RunStatus.FAILED)
    older = make_run(pattern, status=RunStatus.SUCCEEDED)
    LoopRun.objects.filter(pk=older.pk).update(created_at=timezone.now() - timedelta(days=2))
    charge(done, tokens=1500 + 500, cost=0.25)
    charge(older, tokens=700, cost=0.125, at=timezone.now() - timedelta(days=2))
    LoopStep.objects.create(
        run=done, seq=2, role="maker", invocation="maker:0", kind="model", status="failed",
        error="HTTP 503", response={"endpoint": "primary"},
    )  # fmt: skip
    LoopEvent.objects.create(
        run=done, seq=9, type="run.retry_later",
        data={"kind": "model", "endpoint": "backup",
              "failures": [{"endpoint": "primary", "error": "503"}, {"endpoint": "backup", "error": "timeout"}]},
    )  # fmt: skip
    response = client_as("viewer").get("/ui/metrics?days=7")
    assert response.status_code == 200
    text = html_module.unescape(response.content.decode())
    today = timezone.now().date().isoformat()
    two_days_ago = (timezone.now() - timedelta(days=2)).date().isoformat()
    runs = text.split('id="chart-runs"')[1].split("</figure>")[0]
    assert runs.count("<rect") == 3 and runs.count("<text") >= 4
    assert f"<title>{today} · succeeded: 1</title>" in runs
    assert f"<title>{today} · failed: 1</title>" in runs
    assert f"<title>{two_days_ago} · succeeded: 1</title>" in runs
    tokens = text.split('id="chart-tokens"')[1].split("</figure>")[0]
    assert f"<title>{today} · tokens (in + out): 2k</title>" in tokens
    assert f"<title>{two_days_ago} · tokens (in + out): 700</title>" in tokens
    assert f"<title>{today} · cost: 0.2500</title>" in text
    assert f"<title>{two_days_ago} · cost: 0.1250</title>" in text
    errors = text.split('id="chart-errors"')[1].split("</figure>")[0]
    assert f"<title>{today} · primary: 2</title>" in errors
    assert f"<title>{today} · backup: 1</title>" in errors
    assert "(nothing in this window)" in text.split('id="chart-waits"')[1].split("</figure>")[0]

"""The Metrics page's charts in a real Chromium, at 1440 px and on a 390 px phone: the bars
are drawn, a tooltip names a bar's figure, and nothing needs sideways scrolling."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from loops.models import RunStatus
from tests.support.factories import make_pattern, make_run
from tests.support.usage import charge
from tests.ui.conftest import Browser, screenshot

pytestmark = [pytest.mark.ui, pytest.mark.django_db(transaction=True)]


def test_the_metrics_charts_draw_and_fit_a_phone(browser: Browser) -> None:
    pattern = make_pattern()
    for status in (RunStatus.SUCCEEDED, RunStatus.SUCCEEDED, RunStatus.FAILED):
        run = make_run(pattern, status=status)
        charge(run, tokens=800 + 200, cost=0.01)
    page = browser.logged_in("viewer")
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto("/ui/metrics?days=7")
    bars = page.locator("#chart-runs rect.chart-bar")
    expect(bars).to_have_count(2)  # today: succeeded, failed
    expect(page.locator("#chart-runs .chart-legend")).to_contain_text("succeeded")
    expect(page.locator("#chart-tokens rect.chart-bar title").first).to_have_text(
        f"{page.evaluate('new Date().toISOString().slice(0, 10)')} · tokens (in + out): 3k"
    )
    screenshot(page, "metrics-1440")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto("/ui/metrics?days=7")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the metrics page is {width} px wide on a 390 px phone"
    screenshot(page, "metrics-390")

"""The monitor in a real Chromium: search, sort and cursor pages by its controls, a row saying
what its run is doing, and the page at a phone's width without sideways scrolling."""

from __future__ import annotations

from decimal import Decimal

import pytest
from playwright.sync_api import expect

from loops.models import LoopStep, RunStatus
from tests.support.factories import make_pattern, make_run
from tests.ui.conftest import Browser, screenshot

pytestmark = [pytest.mark.ui, pytest.mark.django_db(transaction=True)]


def test_the_monitor_searches_sorts_and_pages_and_fits_a_phone(browser: Browser) -> None:
    pattern = make_pattern(key="docs-sync")
    bindings = {"leader": "lea", "makers": ["max"], "verifier": "vera"}
    for n in range(55):
        make_run(pattern, goal=f"Sync page {n}", role_bindings=bindings)
    busy = make_run(
        pattern, status=RunStatus.RUNNING, goal="Rewrite the billing module", attempts=1,
        role_bindings=bindings,
    )  # fmt: skip
    LoopStep.objects.create(
        run=busy, seq=1, role="maker", invocation="maker:0", kind="tool", name="write",
        status="started", tokens_in=1200, tokens_out=300, cost=Decimal("0.0420"),
    )  # fmt: skip
    page = browser.logged_in("viewer")
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto("/")
    row = page.locator(f"#run-{busy.id}")
    expect(row).to_contain_text("Rewrite the billing module")
    expect(row).to_contain_text("Maker 1 (max) · tool write")
    expect(page.locator('[data-count="in_flight"]')).to_have_text("1")
    screenshot(page, "monitor-1440")

    page.get_by_label("Search").fill("billing")
    page.get_by_role("button", name="Apply filters").click()
    expect(page.locator("#runs-body tr")).to_have_count(1)
    page.goto("/")
    page.get_by_label("Sort").select_option("cost")
    page.get_by_role("button", name="Apply filters").click()
    expect(page.locator("#runs-body tr").first).to_have_id(f"run-{busy.id}")
    page.get_by_role("link", name="Next →").click()
    expect(page.locator("#runs-body tr")).to_have_count(6)
    expect(page.get_by_role("link", name="← Previous")).to_be_visible()

    page.set_viewport_size({"width": 390, "height": 844})
    page.goto("/")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the monitor is {width} px wide on a 390 px phone"
    screenshot(page, "monitor-390")

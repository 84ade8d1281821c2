"""Live text in a real Chromium: the run page shows a streaming step's text as it grows and
removes it when the call returns, without a reload (the page's script and the live feed)."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from loops import live_text
from loops.live_text import LiveText
from loops.models import RunStatus
from tests.support.factories import make_run
from tests.ui.conftest import Browser, screenshot

pytestmark = [pytest.mark.ui, pytest.mark.django_db(transaction=True)]


def test_the_run_page_shows_live_text_as_it_grows_and_drops_it_when_the_step_is_done(
    browser: Browser,
) -> None:
    run = make_run(status=RunStatus.RUNNING)
    page = browser.logged_in("viewer")
    page.goto(f"/runs/{run.id}")
    expect(page.locator("[data-live-indicator]")).to_have_text("Live")
    page.evaluate("window.__noReload = true")
    store = live_text.store()

    store.put(run.id, LiveText("maker:0", "maker", "Reading the", 11, time.time()))
    item = page.locator("#inv-maker-0 #live-inv-maker-0")
    expect(item).to_contain_text("Reading the")
    expect(page.locator("#inv-maker-0 h3")).to_contain_text("Maker 1")
    expect(page.locator("#timeline-empty")).to_be_hidden()

    store.put(run.id, LiveText("maker:0", "maker", "Reading the notes first.", 24, time.time()))
    expect(item.locator("[data-live-text]")).to_have_text("Reading the notes first.")
    screenshot(page, "run-live-text")

    store.clear(run.id, "maker:0")
    expect(item).to_have_count(0)
    assert page.evaluate("window.__noReload === true"), "the page was reloaded"

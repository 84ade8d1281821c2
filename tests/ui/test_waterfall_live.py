"""The run page's waterfall follows the run live: the run feed sends it redrawn with the header
(test client, no browser), and in a real Chromium a decided approval's bar turns from running
to done without a reload, a bar the reader opened staying open."""

from __future__ import annotations

import pytest
from django.test import RequestFactory
from playwright.sync_api import expect

from frontend.streams import RunFeed
from loops.models import ActionApproval
from loops.services.approvals import approval_decide
from orchestrator.accounts.services import user_ensure
from tests.conftest import PERSONAS
from tests.support.approvals import approval_pattern, park_directly, write_call
from tests.ui.conftest import Browser, make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("seeded_profiles")]


def _approve(approval: ActionApproval) -> None:
    approver = user_ensure(username="approver", roles=PERSONAS["approver"])
    approval_decide(approval_id=approval.id, user=approver, decision="approve")


def test_the_run_feed_sends_the_waterfall_redrawn_with_the_header() -> None:
    run = park_directly(approval_pattern("wf-feed"), [write_call("notes.txt", "hello")])
    approval = ActionApproval.objects.get(run=run)
    request = RequestFactory().get(f"/ui/stream/runs/{run.id}")
    request.user = make_user("viewer")
    feed = RunFeed(request, run.id, after_event=10_000, after_step=10_000, open_steps=set())

    [header] = [m for m in feed.poll() if m.event == "run"]
    drawn = header.data["waterfall_html"]
    assert 'id="waterfall"' in drawn and 'data-kind="approval" data-status="running"' in drawn
    assert not [m for m in feed.poll() if m.event == "run"]  # nothing changed: not redrawn

    _approve(approval)
    [header] = [m for m in feed.poll() if m.event == "run"]
    assert 'data-kind="approval" data-status="ok"' in header.data["waterfall_html"]


@pytest.mark.ui
def test_a_decided_approval_shows_in_the_open_waterfall_without_a_reload(
    browser: Browser,
) -> None:
    run = park_directly(approval_pattern("wf-live"), [write_call("notes.txt", "hello")])
    approval = ActionApproval.objects.get(run=run)
    page = browser.logged_in("viewer")
    page.goto(f"/runs/{run.id}")
    expect(page.locator("[data-live-indicator]")).to_have_text("Live")
    page.evaluate("window.__noReload = true")
    waterfall = page.locator("#waterfall")
    wait = waterfall.locator("[data-kind='approval']")
    expect(wait).to_have_attribute("data-status", "running")
    tool = waterfall.locator("[data-kind='tool']").first
    tool.locator("summary").click()
    expect(tool.locator(".wf-input")).to_be_visible()

    _approve(approval)
    expect(wait).to_have_attribute("data-status", "ok", timeout=15_000)
    expect(wait.locator(".wf-label")).not_to_contain_text("running")
    expect(waterfall.locator("[data-kind='tool']").first.locator(".wf-input")).to_be_visible()
    assert page.evaluate("window.__noReload === true"), "the page was reloaded"

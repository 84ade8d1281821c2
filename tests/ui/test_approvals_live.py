"""The approvals queue follows new and decided approvals live: the feed (test client, no
browser) and the page in a real Chromium, with approvals requested and decided elsewhere."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.test import Client, RequestFactory
from playwright.sync_api import expect

from frontend.selectors.approvals import queue_version
from frontend.streams import ApprovalsFeed
from loops.models import ActionApproval
from loops.services.approvals import approval_decide
from orchestrator.accounts.services import user_ensure
from tests.conftest import PERSONAS
from tests.support.approvals import approval_pattern, park_directly, write_call
from tests.ui.conftest import Browser, make_user

ClientAs = Callable[[str], Client]


def _approver() -> object:
    return user_ensure(username="approver", roles=PERSONAS["approver"])


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("seeded_profiles")
def test_the_feed_sends_the_queue_only_when_it_changed() -> None:
    request = RequestFactory().get("/ui/stream/approvals")
    request.user = make_user("viewer")
    feed = ApprovalsFeed(request, queue_version())
    assert feed.poll() == []  # nothing changed since the page was drawn

    run = park_directly(approval_pattern("live-feed"), [write_call("a.txt", "A")])
    approval = ActionApproval.objects.get(run=run)
    [message] = feed.poll()
    assert message.event == "queue" and message.data["pending"] == 1
    assert f'id="approval-{approval.id}"' in message.data["html"]
    assert "Decide" not in message.data["html"]  # a viewer is offered no decision
    assert feed.poll() == []

    approval_decide(approval_id=approval.id, user=_approver(), decision="reject", reason="no")
    [message] = feed.poll()
    assert message.data["pending"] == 0
    assert "Nothing is waiting for approval." in message.data["html"]
    assert "rejected" in message.data["html"]


@pytest.mark.django_db
def test_the_stream_is_an_event_stream_for_any_role(client_as: ClientAs) -> None:
    response = client_as("viewer").get("/ui/stream/approvals?v=x")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/event-stream")
    response.close()


@pytest.mark.ui
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("seeded_profiles")
def test_the_queue_page_shows_new_and_decided_approvals_without_a_reload(
    browser: Browser,
) -> None:
    page = browser.logged_in("approver")
    page.goto("/approvals")
    expect(page.locator("#approvals-empty")).to_be_visible()
    expect(page.locator("[data-live-indicator]")).to_have_text("Live")
    page.evaluate("window.__noReload = true")

    run = park_directly(approval_pattern("live-page"), [write_call("notes.txt", "hello")])
    approval = ActionApproval.objects.get(run=run)
    row = page.locator(f"#approvals-pending #approval-{approval.id}")
    expect(row).to_contain_text("notes.txt", timeout=15_000)
    expect(row.get_by_role("link", name="Decide approval of write")).to_be_visible()

    approval_decide(approval_id=approval.id, user=_approver(), decision="approve")
    expect(page.locator("#approvals-empty")).to_be_visible(timeout=15_000)
    expect(page.locator(f"#approvals-decided #approval-{approval.id}")).to_contain_text("approved")
    assert page.evaluate("window.__noReload === true"), "the page was reloaded"

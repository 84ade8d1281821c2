"""The employee page's OpenAI-compatible endpoint panel in a real Chromium: the curl example is
copied to the clipboard by its button, and an admin grants a user access and removes it again
(confirming the removal)."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from gateway.models import EmployeeGrant
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import user_ensure
from orchestrator.agents.services import employee_create, model_endpoint_create
from tests.ui.conftest import Browser, screenshot

pytestmark = [pytest.mark.ui, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_an_admin_copies_the_example_and_grants_and_removes_access(
    browser: Browser, live_server: Any
) -> None:
    endpoint = model_endpoint_create(name="offline", provider="scripted", script="demo")
    employee_create(username="mk", endpoint=endpoint)
    user_ensure(username="alice", roles=[Role.VIEWER])
    page = browser.logged_in("admin")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.goto("/employees/mk")
    expect(page.locator("#chat-base-url")).to_have_text(f"{live_server.url}/v1")

    page.get_by_role("button", name="Copy curl").click()
    expect(page.get_by_role("button", name="Copied")).to_be_visible()
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied.startswith(f"curl {live_server.url}/v1/chat/completions")
    assert '"model": "mk"' in copied

    page.get_by_label("Username").fill("alice")
    page.get_by_role("button", name="Grant access").click()
    expect(page.get_by_text("alice may now call mk.")).to_be_visible()
    screenshot(page, "employee-endpoint")
    assert EmployeeGrant.objects.filter(user__username="alice").exists()

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Remove alice").click()
    expect(page.get_by_text("alice may no longer call mk.")).to_be_visible()
    assert not EmployeeGrant.objects.exists()

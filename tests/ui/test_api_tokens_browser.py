"""The API tokens page in a real Chromium against the live server: an admin creates a token
(shown once, with a copy button) that works over real HTTP, revokes it after a confirmation
page and it is refused at once; the list fits a phone's width; the page in dark mode. Screenshots
at 1440 px, 390 px and dark under test-artifacts/screenshots/."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from decimal import Decimal
from typing import Any

import pytest
from playwright.sync_api import expect

from orchestrator.accounts.models import ApiToken
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import api_token_create, user_ensure
from tests.ui.conftest import Browser, screenshot

pytestmark = [pytest.mark.ui, pytest.mark.django_db(transaction=True)]


def _status_with(base_url: str, token: str) -> int:
    """The status of a real HTTP GET of the patterns with ``token``."""
    url, headers = f"{base_url}/api/v1/patterns", {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - the live server
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _page_width(page: Any) -> int:
    return int(page.evaluate("document.documentElement.scrollWidth"))


def test_an_admin_creates_a_token_sees_it_once_and_revokes_it(
    browser: Browser, live_server: Any
) -> None:
    robot = user_ensure(username="robot-with-a-long-name", roles=(Role.OPERATOR,))
    api_token_create(user=robot, name="nightly", daily_token_quota=5000)
    api_token_create(user=robot, name="cost-capped", daily_cost_quota=Decimal("12.5"))
    page = browser.logged_in("admin")
    page.set_viewport_size({"width": 1440, "height": 900})
    page.get_by_role("navigation", name="Main").get_by_role("link", name="API tokens").click()
    expect(page.get_by_role("heading", name="API tokens", exact=True)).to_be_visible()
    expect(page.locator("table.tokens-table tbody tr")).to_have_count(2)
    expect(page.locator("table.tokens-table")).to_contain_text("5000 tokens")

    page.get_by_label("Username").fill("ci-bot")
    page.get_by_role("checkbox", name="operator").check()
    page.get_by_role("textbox", name="Name", exact=True).fill("ci")
    page.get_by_label("Daily token quota").fill("-3")
    page.get_by_role("button", name="Create token").click()
    expect(page.locator("#field-daily_token_quota .field-errors")).to_be_visible()
    assert not ApiToken.objects.filter(user__username="ci-bot").exists()
    page.get_by_label("Daily token quota").fill("1000")
    page.get_by_role("button", name="Create token").click()
    expect(page.get_by_role("heading", name="API token created")).to_be_visible()
    expect(page.get_by_role("alert")).to_contain_text("It will not be shown again")
    expect(page.get_by_role("button", name="Copy")).to_be_attached()
    token = page.locator("#new-token").inner_text()
    assert re.fullmatch(r"lw_[0-9a-f]{12}_\S+", token)
    screenshot(page, "api-token-created")
    assert _status_with(live_server.url, token) == 200

    page.get_by_role("link", name="Back to API tokens").click()
    prefix = token.split("_")[1]
    row = page.locator(f"#token-{prefix}")
    expect(row).to_contain_text("ci-bot")
    expect(row).to_contain_text("operator")
    expect(row).to_contain_text("live")
    assert token not in page.content() and token.split("_", 2)[2] not in page.content()
    screenshot(page, "api-tokens-1440")

    row.get_by_role("link", name=re.compile("Revoke")).click()
    expect(page.get_by_role("heading", name=re.compile("Revoke token"))).to_be_visible()
    assert _status_with(live_server.url, token) == 200  # not before the confirmation
    page.get_by_role("button", name="Revoke token").click()
    expect(page.locator(".flash")).to_contain_text("revoked")
    expect(page.locator(f"#token-{prefix}")).to_contain_text("revoked")
    assert _status_with(live_server.url, token) == 401

    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    expect(page.locator(f"#token-{prefix}")).to_be_visible()
    assert _page_width(page) <= 390
    screenshot(page, "api-tokens-390")

    page.set_viewport_size({"width": 1440, "height": 900})
    page.emulate_media(color_scheme="dark")
    page.reload()
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(15, 20, 26)"
    screenshot(page, "api-tokens-dark")


def test_the_page_is_for_admins_only(browser: Browser) -> None:
    page = browser.logged_in("operator")
    nav = page.get_by_role("navigation", name="Main")
    expect(nav.get_by_role("link", name="Gateway")).to_be_visible()
    expect(nav.get_by_role("link", name="API tokens")).to_have_count(0)
    response = page.goto("/api-tokens")
    assert response is not None and response.status == 403
    expect(page.get_by_text("This needs the admin role")).to_be_visible()

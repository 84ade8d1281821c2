"""The Approvals pages in a real Chromium against the live server: an approver finds a gated
call in the queue, fixes a bad edit shown at the field and approves the edited call; decisions
inline on the run page, with a decision made elsewhere arriving live; a viewer sees but cannot
act. Runs are parked through the real services (``park_directly``)."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from loops.models import ActionApproval, LoopRun, RunStatus
from loops.services.approvals import approval_decide
from orchestrator.accounts.services import user_ensure
from tests.conftest import PERSONAS
from tests.support.approvals import approval_pattern, park_directly, write_call
from tests.ui.conftest import Browser, screenshot

pytestmark = [
    pytest.mark.ui,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
]


def test_an_approver_fixes_a_bad_edit_and_approves_the_edited_call(browser: Browser) -> None:
    run = park_directly(approval_pattern("ui-approve"), [write_call("notes.txt", "hello")])
    approval = ActionApproval.objects.get(run=run)
    page = browser.logged_in("approver")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Approvals").click()
    expect(page.get_by_role("heading", name="Approvals", exact=True)).to_be_visible()
    row = page.locator(f"#approval-{approval.id}")
    expect(row).to_contain_text("write")
    expect(row).to_contain_text("notes.txt")
    expect(row).to_contain_text("Approvals test direct")
    expect(row).to_contain_text(approval.reason)
    screenshot(page, "approvals")

    row.get_by_role("link", name=re.compile("Decide")).click()
    expect(page).to_have_url(re.compile(rf"/approvals/{approval.id}$"))
    arguments = page.get_by_label("Arguments (JSON)")
    expect(arguments).to_have_value(re.compile('"content": "hello"'))
    arguments.fill(json.dumps({"path": "notes.txt"}))
    page.get_by_role("button", name="Approve").click()
    field = page.locator("#field-input")
    expect(field).to_have_class(re.compile("field-invalid"))
    expect(field.locator(".field-errors")).to_contain_text("'content' is a required property")
    screenshot(page, "approval-invalid-edit")
    approval.refresh_from_db()
    assert approval.status == "pending"

    edited = {"path": "notes.txt", "content": "hello, reviewed"}
    page.get_by_label("Arguments (JSON)").fill(json.dumps(edited))
    page.get_by_label("Reason").fill("friendlier wording")
    page.get_by_role("button", name="Approve").click()
    expect(page.locator(".flash")).to_contain_text("Approved")
    expect(page.locator(".approval-decided-by")).to_have_text("approver")
    expect(page.locator(".approval-decision-reason")).to_have_text("friendlier wording")
    screenshot(page, "approval-decided")
    approval.refresh_from_db()
    assert (approval.status, approval.decided_input) == ("approved", edited)
    assert LoopRun.objects.get(pk=run.id).status == RunStatus.QUEUED


def test_decisions_inline_on_the_run_page_and_one_made_elsewhere_arrives_live(
    browser: Browser,
) -> None:
    run = park_directly(
        approval_pattern("ui-inline"), [write_call("a.txt", "A"), write_call("b.txt", "B")]
    )
    first, second = ActionApproval.objects.filter(run=run).order_by("step_seq")
    page = browser.logged_in("approver")
    page.goto(f"/runs/{run.id}")
    inline = page.locator("#run-approvals")
    expect(inline.locator("form.decide-form")).to_have_count(2)
    screenshot(page, "run-approvals-inline")

    mine = page.locator(f"#inline-approval-{first.id}")
    mine.get_by_label("Reason").fill("a.txt stays as it is")
    mine.get_by_role("button", name="Reject").click()
    expect(page).to_have_url(re.compile(rf"/runs/{run.id}$"))
    expect(page.locator(".flash")).to_contain_text("Rejected")
    expect(mine).to_have_attribute("data-status", "rejected")
    expect(mine).to_contain_text("a.txt stays as it is")
    expect(inline.locator("form.decide-form")).to_have_count(1)
    expect(page.locator("[data-live-indicator]")).to_have_text("Live")
    page.evaluate("window.__noReload = true")

    # Someone else approves the other call (the API, say): the run resumes, the page follows.
    approval_decide(
        approval_id=second.id,
        user=user_ensure(username="approver", roles=PERSONAS["approver"]),
        decision="approve",
    )
    expect(page.locator(f"#inline-approval-{second.id}")).to_have_attribute(
        "data-status", "approved"
    )
    expect(inline.locator("form.decide-form")).to_have_count(0)
    expect(page.locator("#run-summary .badge").first).to_have_text("queued")
    assert page.evaluate("window.__noReload === true"), "the page was reloaded"


def test_a_viewer_sees_the_queue_but_is_offered_no_decision(browser: Browser) -> None:
    run = park_directly(approval_pattern("ui-viewer"), [write_call("notes.txt", "hello")])
    approval = ActionApproval.objects.get(run=run)
    page = browser.logged_in("viewer")
    page.goto("/approvals")
    row = page.locator(f"#approval-{approval.id}")
    expect(row).to_contain_text("notes.txt")
    row.get_by_role("link", name=re.compile("View")).click()
    expect(page.locator("#cannot-decide")).to_contain_text("needs the approver role")
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    page.goto(f"/runs/{run.id}")
    expect(page.locator("#run-approvals")).to_contain_text("notes.txt")
    expect(page.locator("#run-actions form")).to_have_count(0)
    approval.refresh_from_db()
    assert approval.status == "pending"

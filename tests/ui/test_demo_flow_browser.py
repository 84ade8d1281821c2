"""The whole demo loop in a real Chromium, as an operator and an approver live it: log in,
trigger the seeded demo pattern from its page, watch the timeline fill in live while a real
worker drives the production AgentInvoker on the scripted model, approve the gated write with
edited input, and see the run succeed with its diff artifact rendered as a diff."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from playwright.sync_api import expect

from loops.models import ActionApproval, LoopRun, RunStatus
from tests.support.workers import WorkerProcess
from tests.ui.conftest import Browser, screenshot

pytestmark = [
    pytest.mark.ui,
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
]
AGENT = {"LOOPWRIGHT_INVOKER": "loops.worker.invoker.AgentInvoker"}


def test_trigger_watch_approve_with_edits_and_see_the_diff(
    browser: Browser, worker_factory: Any, tmp_path: Path
) -> None:
    call_command("seed_demo", "--no-run", verbosity=0)
    worker: WorkerProcess = worker_factory("demo", **AGENT)

    page = browser.logged_in("operator")
    page.goto("/patterns/demo-hello")
    page.get_by_role("link", name="Trigger now").click()
    page.get_by_label("Inputs").fill(json.dumps({"path": "hello.txt"}))
    page.get_by_role("button", name="Start run").click()
    expect(page).to_have_url(re.compile(r"/runs/[0-9a-f-]{36}$"))
    run = LoopRun.objects.get()
    page.evaluate("window.__noReload = true")

    # The timeline fills in live: the leader's steps, then the maker's, then the gate.
    expect(page.locator("#inv-leader .step").first).to_be_visible(timeout=60_000)
    expect(page.locator("#run-summary .badge").first).to_have_text(
        "waiting approval", timeout=90_000
    )
    inline = page.locator("#run-approvals .approval-inline")
    expect(inline).to_have_count(1, timeout=10_000)
    expect(inline).to_contain_text("write")
    assert page.evaluate("window.__noReload === true"), "the run page was reloaded"
    screenshot(page, "demo-waiting-approval")
    approval = ActionApproval.objects.get(run=run)
    assert approval.status == "pending" and approval.tool_name == "write"

    # An approver edits the proposed content on the approval's own page and approves it.
    approver = browser.logged_in("approver")
    approver.goto(f"/approvals/{approval.id}")
    edited = {"path": "hello.txt", "content": "Hello, reviewed world.\n"}
    approver.get_by_label("Arguments (JSON)").fill(json.dumps(edited))
    approver.get_by_label("Reason").fill("friendlier, and reviewed")
    approver.get_by_role("button", name="Approve").click()
    expect(approver.locator(".flash")).to_contain_text("Approved")
    screenshot(approver, "demo-approved")

    # Back on the operator's page, the run resumes and succeeds without a reload.
    expect(page.locator("#run-summary .badge").first).to_have_text("succeeded", timeout=90_000)
    assert page.evaluate("window.__noReload === true"), "the run page was reloaded"
    diff = page.locator("#run-artifacts pre.diff")
    expect(diff).to_be_visible(timeout=10_000)
    expect(diff.locator(".diff-add")).to_contain_text(["+Hello, reviewed world."])
    expect(diff.locator(".diff-del").filter(has_text="-Hello, world.")).to_have_count(1)
    expect(page.locator("#run-verdict")).to_contain_text("pass")
    screenshot(page, "demo-succeeded-with-diff")

    run.refresh_from_db()
    assert (run.status, run.terminal_reason) == (RunStatus.SUCCEEDED, "verified")
    approval.refresh_from_db()
    assert approval.decided_input == edited and approval.executed_hash == approval.approved_hash
    assert worker.alive()

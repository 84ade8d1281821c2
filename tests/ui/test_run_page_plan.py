"""A run's page says where its time went and what it planned: the leader's plan as a task list
(not its raw JSON), model time, tool time and approval wait apart (a gated step's own time
without the wait), at 1440 px and on a 390 px phone. The run is a real engine run in this
process with a human approval in the middle (``tests.support.approvals.Engine``)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from playwright.sync_api import expect

from loops.models import ActionApproval, LoopRun, LoopStep, RunStatus
from loops.services.approvals import approval_decide
from orchestrator.accounts.services import user_ensure
from tests.conftest import PERSONAS
from tests.support.approvals import PLAN, Engine, approval_pattern, park_inline, pending_approvals
from tests.ui.conftest import Browser, screenshot

pytestmark = [
    pytest.mark.ui,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
]


@pytest.fixture
def approved_run(tmp_path: Path) -> LoopRun:
    """A run whose write waited four minutes for its approval and then ran for five seconds
    (the times are set on the rows the engine wrote)."""
    engine = Engine(tmp_path / "ledger")
    run = park_inline(
        engine, approval_pattern("ui-plan"), [("write", {"path": "n.txt", "content": "hi"})]
    )
    [approval] = pending_approvals(run)
    approver = user_ensure(username="approver", roles=PERSONAS["approver"])
    approval_decide(approval_id=approval.id, user=approver, decision="approve")
    assert engine.drive(run.id) == RunStatus.SUCCEEDED
    approval.refresh_from_db()
    assert approval.decided_at is not None
    ActionApproval.objects.filter(pk=approval.pk).update(
        created_at=approval.decided_at - timedelta(minutes=4)
    )
    LoopStep.objects.filter(run=run, seq=approval.step_seq).update(duration_ms=245_000)
    return LoopRun.objects.get(pk=run.id)


def test_the_run_page_shows_the_plan_and_time_apart(
    approved_run: LoopRun, browser: Browser
) -> None:
    run = approved_run
    approval = ActionApproval.objects.get(run=run)
    page = browser.logged_in("viewer")
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"/runs/{run.id}")
    tasks = page.locator("#run-plan .plan-tasks li")
    expect(tasks).to_have_count(len(PLAN["tasks"]))
    expect(tasks.first).to_contain_text(PLAN["tasks"][0]["title"])
    expect(page.locator("#run-time-split")).to_contain_text("approval wait 4m")
    gated = page.locator(f"#step-{approval.step_seq}")
    expect(gated).to_contain_text("waited 4m for approval")
    expect(gated).to_contain_text("ran 5.0 s")
    leader = page.locator("li.step-model").first
    expect(leader).to_contain_text("A plan of")
    expect(leader).not_to_contain_text('{"tasks"')
    screenshot(page, "run-plan-1440")

    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"/runs/{run.id}")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the run page is {width} px wide on a 390 px phone"
    screenshot(page, "run-plan-390")

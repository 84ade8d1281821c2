"""The run page's waterfall of spans in a real Chromium: lanes by role, bars placed by time,
tokens on the model bars, the failed call red, and a click opening a call's input and output.
The run is a real engine run in this process (``tests.support.approvals.Engine``) with a human
approval in the middle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from loops.models import LoopRun, LoopStep, RunStatus
from loops.services.approvals import approval_decide
from orchestrator.accounts.services import user_ensure
from tests.conftest import PERSONAS
from tests.support.approvals import Engine, approval_pattern, park_inline, pending_approvals
from tests.ui.conftest import Browser, screenshot

pytestmark = [
    pytest.mark.ui,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
]


@pytest.fixture
def finished_run(tmp_path: Path) -> LoopRun:
    """Made before the browser starts: Playwright's loop would hold the engine's thread."""
    engine = Engine(tmp_path / "ledger")
    pattern = approval_pattern("ui-waterfall")
    run = park_inline(
        engine,
        pattern,
        [("read", {"path": "README.md"})],  # fails: the workspace has no README.md
        [("write", {"path": "notes.txt", "content": "hello"})],
    )
    [approval] = pending_approvals(run)
    approver = user_ensure(username="approver", roles=PERSONAS["approver"])
    approval_decide(approval_id=approval.id, user=approver, decision="approve")
    assert engine.drive(run.id) == RunStatus.SUCCEEDED
    return LoopRun.objects.get(pk=run.id)


def box(locator: Any) -> dict[str, float]:
    found = locator.bounding_box()
    assert found is not None
    return dict(found)


def test_the_run_page_draws_its_spans_as_a_waterfall(
    finished_run: LoopRun, browser: Browser, tmp_path: Path
) -> None:
    run = finished_run
    page = browser.logged_in("viewer")
    page.goto(f"/runs/{run.id}")
    waterfall = page.locator("#waterfall")
    expect(waterfall.get_by_role("heading", name="Spans")).to_be_visible()
    lanes = waterfall.locator(".wf-lane-title")
    expect(lanes).to_have_count(4)
    expect(lanes.nth(0)).to_have_text("Run")
    bars = waterfall.locator(".wf-bar")
    steps = LoopStep.objects.filter(run=run).exclude(kind="notice").count()
    # The run, three invocations, every step and the approval wait.
    expect(bars).to_have_count(1 + 3 + steps + 1)
    for index in range(bars.count()):
        expect(bars.nth(index)).to_be_visible()

    run_bar = box(waterfall.locator(".wf-run .wf-bar"))
    leader = box(waterfall.locator(".wf-lane-leader .wf-invocation .wf-bar"))
    verifier = box(waterfall.locator(".wf-lane-verifier .wf-invocation .wf-bar"))
    assert abs(leader["x"] - run_bar["x"]) < run_bar["width"] * 0.2  # the leader acts first
    assert verifier["x"] > leader["x"] + leader["width"] - 1  # the verifier after it
    assert verifier["x"] + verifier["width"] <= run_bar["x"] + run_bar["width"] + 1

    failed = waterfall.locator(".wf-failed[data-kind='tool']")
    expect(failed).to_have_count(1)
    expect(failed.locator(".wf-label")).to_contain_text("failed")
    color = failed.locator(".wf-bar").evaluate("el => getComputedStyle(el).backgroundColor")
    assert color == "rgb(207, 34, 46)"
    expect(waterfall.locator(".wf-slow")).not_to_have_count(0)
    model = waterfall.locator(".wf-lane-maker .wf-model").first
    expect(model.locator(".wf-label")).to_contain_text("tok")
    expect(waterfall.locator(".wf-approval")).to_have_count(1)

    write = waterfall.locator(".wf-lane-maker [data-kind='tool']").nth(1)
    expect(write.locator(".wf-input")).to_be_hidden()
    write.locator("summary").click()
    expect(write.locator(".wf-input")).to_be_visible()
    expect(write.locator(".wf-input")).to_contain_text("notes.txt")
    expect(write.locator(".wf-output")).to_be_visible()
    expect(write.locator(".wf-detail")).to_contain_text("tier write")
    shot = tmp_path / "run-waterfall.png"
    waterfall.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000
    screenshot(page, "run-waterfall")  # the whole page, for people to look at

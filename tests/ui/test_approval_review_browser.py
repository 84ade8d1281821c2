"""The review flow of a skill call in a real Chromium, end to end (docs/approvals.md).

Two runs whose maker calls a reviewed skill (``rev_add``, tests/support/reviews.py) through its
own tool, driven by a real loops worker with the production AgentInvoker against a scripted
model over loopback HTTP; a real skills worker runs the skill in the sandbox. Each run parks on
the call. At 1440 px an approver opens the approval: both forms are there, prefilled; a review
without its verdict is refused at the field; the approver edits an argument, fills the review
and approves: the run goes on, the skill runs with the edited input, and the model gets the
review with the result. At 390 px another approval is rejected with a review from the run page:
nothing runs, and the rejection the model gets carries the review.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from loops.models import ActionApproval, LoopRun, RunStatus
from loops.services.runs import run_trigger
from orchestrator.agents.services import employee_create, model_endpoint_create
from skillhub.models import SkillExecution
from tests.skillhub.conftest import SkillsWorker, skill_worker_env, start_skills_worker
from tests.support.approvals import LEADER, MAKER, VERIFIER, approval_pattern, http_reply
from tests.support.model_server import ModelServer
from tests.support.reviews import TOOL, reviewed_skill
from tests.support.workers import WorkerProcess, wait_for
from tests.ui.conftest import Browser, screenshot

pytestmark = [
    pytest.mark.one_backend,
    pytest.mark.ui,
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
    pytest.mark.timeout(600),
]
WAIT = 240
SETTLED = (
    RunStatus.SUCCEEDED,
    RunStatus.FAILED,
    RunStatus.WAITING_HUMAN,
    RunStatus.WAITING_APPROVAL,
)


@pytest.fixture
def model() -> Iterator[ModelServer]:
    with ModelServer() as server:
        server.always(http_reply)
        yield server
    server.check()


@pytest.fixture
def workers(model: ModelServer, tmp_path: Path) -> Iterator[tuple[WorkerProcess, SkillsWorker]]:
    endpoint = model_endpoint_create(
        name="review-loopback", provider="openai", base_url=model.url, model="review-script",
        max_retries=1, timeout_seconds=60,
    )  # fmt: skip
    for username in (LEADER, VERIFIER):
        employee_create(username=username, endpoint=endpoint, tools=["read", "list"])
    employee_create(username=MAKER, endpoint=endpoint, tools=["read", TOOL])
    reviewed_skill()
    skills = start_skills_worker(tmp_path, "review-skills")
    env = skill_worker_env(LOOPWRIGHT_INVOKER="loops.worker.invoker.AgentInvoker")
    loops = WorkerProcess("review-agent", tmp_path, env).start()
    try:
        loops.wait_ready(timeout=90)
        yield loops, skills
    finally:
        loops.kill()
        skills.kill()


def _settled(run_id: Any, workers: tuple[WorkerProcess, SkillsWorker], *states: str) -> LoopRun:
    loops, skills = workers
    wait_for(
        lambda: LoopRun.objects.get(pk=run_id).status in (states or SETTLED),
        timeout=WAIT, interval=0.5,
        message=f"{loops.log()[-4000:]}\n{skills.log()[-3000:]}",
    )  # fmt: skip
    return LoopRun.objects.get(pk=run_id)


def _trigger(key: str, arguments: dict[str, Any]) -> LoopRun:
    rounds = [[[TOOL, arguments]]]
    return run_trigger(
        pattern=approval_pattern(key), actor="test", inputs={"label": key, "rounds": rounds}
    )


def _tool_messages(model: ModelServer) -> list[str]:
    return [
        str(m.get("content"))
        for body in model.bodies
        for m in body.get("messages", [])
        if m.get("role") == "tool"
    ]


def test_an_approver_edits_the_input_fills_the_review_and_the_skill_runs_with_the_edit(
    browser: Browser, workers: tuple[WorkerProcess, SkillsWorker], model: ModelServer
) -> None:
    approved_run = _trigger("review-approve", {"a": 2, "b": 3})
    rejected_run = _trigger("review-reject", {"a": 900, "b": 900})
    for run in (approved_run, rejected_run):
        parked = _settled(run.id, workers)
        assert parked.status == RunStatus.WAITING_APPROVAL, parked.status_reason
    approval = ActionApproval.objects.get(run=approved_run)
    assert not SkillExecution.objects.filter(run_id=approved_run.id).exists()

    page = browser.logged_in("approver")
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"/approvals/{approval.id}")
    arguments = page.locator("fieldset.input-form")
    review = page.locator("fieldset.review-form")
    expect(arguments.get_by_label("First number")).to_have_value("2")
    expect(arguments.get_by_label("Second number")).to_have_value("3")
    expect(review.get_by_label("Verdict")).to_be_visible()
    screenshot(page, "approval-review-forms-1440")

    # Without the verdict the review is refused, at its field; nothing is decided.
    arguments.get_by_label("First number").fill("40")
    arguments.get_by_label("Second number").fill("2")
    review.get_by_label("Comment").fill("40 + 2 is what the task needs")
    page.get_by_role("button", name="Approve").click()
    verdict = page.locator("#field-review__verdict")
    expect(verdict).to_have_class(re.compile("field-invalid"))
    expect(verdict.locator(".field-errors")).to_contain_text("'verdict' is a required property")
    screenshot(page, "approval-review-invalid-1440")
    approval.refresh_from_db()
    assert approval.status == "pending"

    # The form kept what was typed: fill the verdict, tick a check, approve.
    expect(arguments.get_by_label("First number")).to_have_value("40")
    review.get_by_label("Verdict").select_option("ok")
    review.get_by_label("inputs").check()
    page.get_by_role("button", name="Approve").click()
    expect(page.locator(".flash")).to_contain_text("Approved")
    shown = page.locator(".approval-review")
    expect(shown).to_contain_text("40 + 2 is what the task needs")
    expect(shown).to_contain_text("inputs")
    screenshot(page, "approval-review-decided-1440")

    review_seen = {
        "checks": ["inputs"],
        "comment": "40 + 2 is what the task needs",
        "verdict": "ok",
    }
    approval.refresh_from_db()
    assert (approval.status, approval.decided_input, approval.review) == (
        "approved", {"a": 40, "b": 2}, review_seen,
    )  # fmt: skip
    done = _settled(approved_run.id, workers, RunStatus.SUCCEEDED, RunStatus.FAILED,
                    RunStatus.WAITING_HUMAN)  # fmt: skip
    assert done.status != RunStatus.FAILED, done.status_reason
    [execution] = SkillExecution.objects.filter(run_id=approved_run.id)
    assert (execution.status, execution.inputs, execution.stdout) == (
        "succeeded", {"a": 40, "b": 2}, "sum: 42\n",
    )  # fmt: skip
    told = json.dumps(review_seen, ensure_ascii=False, sort_keys=True)
    assert any(
        "sum: 42" in m and f"Review by approver: {told}" in m for m in _tool_messages(model)
    ), _tool_messages(model)
    page.goto(f"/runs/{approved_run.id}")
    expect(page.locator(f"#inline-approval-{approval.id} .approval-review")).to_contain_text(
        "40 + 2 is what the task needs"
    )

    # A phone-sized run page: the other call is rejected with a review; the model is told it.
    other = ActionApproval.objects.get(run=rejected_run)
    phone = browser.logged_in("approver")
    phone.set_viewport_size({"width": 390, "height": 844})
    phone.goto(f"/runs/{rejected_run.id}")
    inline = phone.locator(f"#inline-approval-{other.id}")
    expect(inline.get_by_label("First number")).to_have_value("900")
    screenshot(phone, "approval-review-run-page-390")
    inline.get_by_label("Verdict").select_option("risky")
    inline.get_by_label("Comment").fill("far too big")
    inline.get_by_label("limits").check()
    inline.get_by_label("Reason").fill("numbers over the limit")
    inline.get_by_role("button", name="Reject").click()
    expect(phone.locator(".flash")).to_contain_text("Rejected")
    expect(inline).to_have_attribute("data-status", "rejected")
    expect(inline.locator(".approval-review")).to_contain_text("far too big")
    screenshot(phone, "approval-review-rejected-390")
    ended = _settled(rejected_run.id, workers, RunStatus.SUCCEEDED, RunStatus.FAILED,
                     RunStatus.WAITING_HUMAN)  # fmt: skip
    assert ended.status != RunStatus.FAILED, ended.status_reason
    assert not SkillExecution.objects.filter(run_id=rejected_run.id).exists()
    rejection = (
        "Rejected by approver: numbers over the limit. The call was not executed.\n"
        'Review by approver: {"checks": ["limits"], "comment": "far too big", "verdict": "risky"}'
    )
    assert rejection in _tool_messages(model), _tool_messages(model)

"""The approvals inbox in a real Chromium: an approver works the queue from the keyboard (j/k
to move, a to approve, r and a reason then Enter to reject; each confirmed in a dialog), and on
a 390 px phone the queue is a list of cards whose buttons fit the screen."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import expect

from loops.models import ActionApproval, LoopRun
from tests.support.approvals import approval_pattern, park_directly, write_call
from tests.ui.conftest import Browser, screenshot

pytestmark = [
    pytest.mark.ui,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
]


def test_an_approver_decides_from_the_keyboard_and_on_a_phone(
    browser: Browser, tmp_path: Path
) -> None:
    (tmp_path / "notes.txt").write_text("hello\nold line\n")
    runs = []
    for key, name in (("kb-a", "a.txt"), ("kb-b", "notes.txt"), ("kb-c", "c.txt")):
        run = park_directly(approval_pattern(key), [write_call(name, "hello\nnew line\n")])
        LoopRun.objects.filter(pk=run.pk).update(cursor={**run.cursor, "workdir": str(tmp_path)})
        runs.append(run)
    first, second, third = (ActionApproval.objects.get(run=r) for r in runs)
    page = browser.logged_in("approver")
    questions: list[str] = []

    def answer(dialog: object) -> None:
        questions.append(dialog.message)  # type: ignore[attr-defined]
        dialog.accept()  # type: ignore[attr-defined]

    page.on("dialog", answer)
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto("/approvals")
    expect(page.locator(f"#approval-{second.id} .diff-add")).to_contain_text("+new line")
    screenshot(page, "approvals-inbox-1440")

    page.keyboard.press("j")
    expect(page.locator(f"#approval-{first.id}")).to_have_class("selected")
    page.keyboard.press("a")
    expect(page.locator(".flash")).to_contain_text("Approved")
    first.refresh_from_db()
    assert first.status == "approved" and questions[0].startswith("Approve write")

    page.keyboard.press("j")
    page.keyboard.press("r")
    reason = page.locator(f"#reason-{second.id}")
    expect(reason).to_be_focused()
    reason.fill("wrong file")
    reason.press("Enter")
    expect(page.locator(".flash")).to_contain_text("Rejected")
    second.refresh_from_db()
    assert (second.status, second.decision_reason) == ("rejected", "wrong file")

    page.set_viewport_size({"width": 390, "height": 844})
    page.goto("/approvals")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the queue is {width} px wide on a 390 px phone"
    approve = page.locator(f"#approval-{third.id}").get_by_role("button", name="Approve")
    box = approve.bounding_box()
    assert box is not None and box["x"] + box["width"] <= 390
    screenshot(page, "approvals-inbox-390")

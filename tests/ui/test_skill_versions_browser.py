"""A skill's History section and its Roll back button in a real Chromium: an operator rolls an
edited skill back with a reason and a confirmation; the restored code shows and the chain
records who and why."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from skillhub.models import Skill
from skillhub.services.skills import skill_create, skill_update
from tests.ui.conftest import Browser, screenshot

pytestmark = [pytest.mark.ui, pytest.mark.django_db(transaction=True)]

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}}


def test_an_operator_rolls_a_skill_back_from_its_history(browser: Browser) -> None:
    skill = skill_create(
        actor="admin", tool_name="shout", title="Shout", language="python",
        input_schema=SCHEMA, code_template="print({{text}}.upper())\n",
    )  # fmt: skip
    skill_update(skill=skill, actor="admin", code_template="print({{text}}.lower())\n")
    page = browser.logged_in("operator")
    questions: list[str] = []

    def answer(dialog: object) -> None:
        questions.append(dialog.message)  # type: ignore[attr-defined]
        dialog.accept()  # type: ignore[attr-defined]

    page.on("dialog", answer)
    page.goto("/skills/shout")
    history = page.locator("#versions")
    expect(history.get_by_role("heading", name="History")).to_be_visible()
    expect(history.locator("#version-2")).to_contain_text("update")
    expect(history.locator("#version-1")).to_contain_text("create")
    page.get_by_label("Reason").fill("lower case breaks the demo")
    screenshot(page, "skill-history")
    page.get_by_role("button", name="Roll back").click()
    expect(page.locator(".flash")).to_contain_text("rolled back to version 1")
    assert questions and "Roll back shout?" in questions[0]
    expect(page.get_by_label("Code template")).to_contain_text(".upper()")
    expect(history.locator("#version-3")).to_contain_text("lower case breaks the demo")
    expect(history.locator("#version-3")).to_contain_text("operator")
    assert Skill.objects.get(tool_name="shout").code_template == "print({{text}}.upper())\n"
    screenshot(page, "skill-rolled-back")


def test_a_viewer_sees_the_history_but_no_roll_back(browser: Browser) -> None:
    skill = skill_create(
        actor="admin", tool_name="echo", title="Echo", language="python",
        input_schema=SCHEMA, code_template="print({{text}})\n",
    )  # fmt: skip
    skill_update(skill=skill, actor="admin", title="Echo 2")
    page = browser.logged_in("viewer")
    page.goto("/skills/echo")
    expect(page.locator("#version-2")).to_be_visible()
    expect(page.get_by_role("button", name="Roll back")).to_have_count(0)

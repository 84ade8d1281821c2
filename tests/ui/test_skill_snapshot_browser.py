"""The snapshot page in a real Chromium against the live server: an operator downloads a
snapshot of every skill from the skills list, changes and removes skills, uploads the file for a
preview (one to create, one that differs), is refused at the replace box when applying without
it, then applies with replace after the confirmation dialog. Screenshots at 1440 and 390 px."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import expect

from skillhub.models import Skill
from skillhub.services.skills import skill_create, skill_update
from tests.ui.conftest import Browser, screenshot

pytestmark = [pytest.mark.ui, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def _skill(tool_name: str) -> Skill:
    return skill_create(
        actor="test", tool_name=tool_name, title=tool_name.title(), language="python",
        code_template="print({{a}})\n", input_schema=SCHEMA,
    )  # fmt: skip


def test_an_operator_downloads_previews_and_applies_a_snapshot(
    browser: Browser, tmp_path: Path
) -> None:
    _skill("alpha")
    _skill("beta")
    page = browser.logged_in("operator")
    page.goto("/skills")
    page.get_by_role("link", name="Snapshots").click()
    expect(page.get_by_role("heading", name="Skill snapshots")).to_be_visible()
    with page.expect_download() as waiting:
        page.get_by_role("link", name="Download a snapshot of all skills").click()
    download = waiting.value
    assert download.suggested_filename.startswith("loopwright-skills-")
    saved = tmp_path / download.suggested_filename
    download.save_as(saved)

    Skill.objects.get(tool_name="alpha").delete()
    skill_update(skill=Skill.objects.get(tool_name="beta"), code_template="print(2)\n")
    page.get_by_role("button", name="Preview").click()
    expect(page.locator("#field-file .field-errors")).to_contain_text("Choose a snapshot file")
    page.get_by_label("Snapshot file").set_input_files(str(saved))
    page.get_by_role("button", name="Preview").click()
    plan = page.locator("#snapshot-plan")
    expect(plan.locator("#plan-alpha")).to_contain_text("created")
    expect(plan.locator("#plan-beta")).to_contain_text("code_template")
    assert not Skill.objects.filter(tool_name="alpha").exists()
    page.set_viewport_size({"width": 1440, "height": 900})
    screenshot(page, "skill-snapshot-preview-1440")

    page.get_by_label("I have read the preview: apply it").check()
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Apply the import").click()
    expect(page.locator("#field-replace .field-errors")).to_contain_text("differ from the snapshot")
    expect(page.locator("#plan-beta")).to_be_visible()
    assert not Skill.objects.filter(tool_name="alpha").exists()
    page.set_viewport_size({"width": 390, "height": 844})
    screenshot(page, "skill-snapshot-conflict-390")

    page.get_by_label("Replace the skills that differ").check()
    page.get_by_label("I have read the preview: apply it").check()
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Apply the import").click()
    expect(page.get_by_role("heading", name="What was done")).to_be_visible()
    expect(page.locator("#snapshot-done")).to_contain_text("replaced: code_template")
    page.set_viewport_size({"width": 1440, "height": 900})
    screenshot(page, "skill-snapshot-result-1440")
    assert Skill.objects.get(tool_name="alpha").created_by == "operator"
    assert Skill.objects.get(tool_name="beta").code_template == "print({{a}})\n"

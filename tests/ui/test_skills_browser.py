"""The Skills pages in a real Chromium against the live server: an operator creates a Python
skill in the editor (a bad placeholder is shown at its field first), runs it from the test panel
in the real sandbox through a real ``celery worker`` consuming this test's skills queue, sees
stdout, exit status, duration and the output file, downloads the file, and finds the execution
in the skill's history."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from skillhub.models import Skill, SkillExecution
from tests.skillhub.conftest import SkillsWorker, start_skills_worker
from tests.ui.conftest import Browser, screenshot

pytestmark = [
    pytest.mark.one_backend,
    pytest.mark.ui,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
]

#: This module's own skills queue: a worker of another test database must not take its messages.
QUEUE = f"ui-skills-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 100}},
    "required": ["name"],
}
CODE = (
    "import pathlib\n"
    "greeting = 'Hello, ' + {{name}} + '!'\n"
    "pathlib.Path('out').mkdir(exist_ok=True)\n"
    "pathlib.Path('out/greeting.txt').write_text(greeting)\n"
    "print(greeting)\n"
)


@pytest.fixture
def skills_worker(settings: Any, tmp_path: Path) -> Iterator[SkillsWorker]:
    """A real skills worker; the live server (same settings) sends executions to its queue."""
    settings.SKILLHUB = {**settings.SKILLHUB, "QUEUE": QUEUE}
    worker = start_skills_worker(tmp_path, "ui-skills", LOOPWRIGHT_SKILL_QUEUE=QUEUE)
    yield worker
    worker.kill()


def test_an_operator_creates_a_python_skill_and_runs_it_from_the_test_panel(
    browser: Browser, skills_worker: SkillsWorker
) -> None:
    page = browser.logged_in("operator")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Skills").click()
    expect(page.get_by_role("heading", name="Skills", exact=True)).to_be_visible()
    expect(page.get_by_text("No skills yet.")).to_be_visible()
    page.get_by_role("link", name="New skill").click()

    page.get_by_label("Tool name").fill("py_greet")
    page.get_by_label("Title").fill("Greet someone")
    page.get_by_label("Description").fill("Says hello and leaves a file")
    page.get_by_label("Language").select_option("python")
    page.get_by_label("Input schema").fill(json.dumps(SCHEMA, indent=2))
    page.get_by_label("Code template").fill(CODE.replace("{{name}}", "{{nme}}"))
    page.get_by_label("Timeout (seconds)").fill("20")
    page.get_by_role("button", name="Create skill").click()
    field = page.locator("#field-code_template")
    expect(field).to_have_class(re.compile("field-invalid"))
    expect(field.locator(".field-errors")).to_contain_text(
        "placeholder {{nme}} is not a property of input_schema"
    )
    screenshot(page, "skill-editor-invalid")
    assert not Skill.objects.exists()

    page.get_by_label("Code template").fill(CODE)
    page.get_by_role("button", name="Create skill").click()
    expect(page.locator(".flash")).to_contain_text("Skill py_greet created.")
    expect(page).to_have_url(re.compile(r"/skills/py_greet$"))

    page.get_by_role("link", name="Test", exact=True).click()
    page.get_by_label("Inputs (JSON)").fill('{"name": "Ada"}')
    page.get_by_role("button", name="Run in sandbox").click()
    result = page.locator("#test-result")
    expect(result.locator(".execution-status")).to_have_text("succeeded", timeout=30_000)
    expect(result.locator(".execution-stdout")).to_have_text("Hello, Ada!\n")
    expect(result.locator(".execution-exit")).to_have_text("0")
    expect(result.locator(".execution-duration")).to_have_text(re.compile(r"\d+(\.\d)? m?s"))
    expect(result.locator(".execution-pending")).to_have_count(0)
    expect(page.get_by_label("Inputs (JSON)")).to_have_value(re.compile('"name": "Ada"'))
    screenshot(page, "skill-test-panel")

    with page.expect_download() as download:
        result.get_by_role("link", name="greeting.txt").click()
    assert download.value.suggested_filename == "greeting.txt"
    assert Path(download.value.path()).read_text() == "Hello, Ada!"

    execution = SkillExecution.objects.get()
    assert (execution.status, execution.origin, execution.principal) == (
        "succeeded",
        "test",
        "user:operator",
    )
    page.get_by_role("link", name="History").click()
    row = page.locator(f"#history-{execution.id}")
    expect(row).to_contain_text("succeeded")
    expect(row).to_contain_text("greeting.txt")
    screenshot(page, "skill-detail")
    page.goto("/skills")
    expect(page.locator("#skill-py_greet")).to_contain_text("Greet someone")
    screenshot(page, "skills")

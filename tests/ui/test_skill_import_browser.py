"""The Git import page in a real Chromium against the live server and a real Git repository
made by the test (served over HTTP on loopback): an operator previews the import (skills to
create, disabled as the service makes them), applies it after the confirmation, then previews
a later commit as a readable diff of the changed program and applies that. Refusals of the
service (a path for a URL, an unknown ref) are shown at their fields."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from skillhub.models import Skill
from tests.support.git_server import GitHttpServer, git
from tests.ui.conftest import Browser, screenshot

pytestmark = [pytest.mark.ui, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

COUNT_MD = """---
toolName: word_count
title: Word count
description: Counts the words of a text
language: python
inputSchema: {"type": "object", "properties": {"text": {"type": "string"}}}
---
Call it with the text to count.
"""
COUNT_PY = "print(len({{text}}.split()))\n"
SHOUT_MD = """---
toolName: shout
title: Shout
language: node
inputSchema: {"type": "object", "properties": {"text": {"type": "string"}}}
---
"""


@pytest.fixture
def published(settings: Any, tmp_path: Path) -> Iterator[tuple[GitHttpServer, Path, str]]:
    """A repository of two skills, pushed to a loopback HTTP server (http allowed for it)."""
    settings.LOOPWRIGHT_OUTBOUND = {
        **settings.LOOPWRIGHT_OUTBOUND, "GIT_SCHEMES": frozenset({"http", "https"})
    }  # fmt: skip
    work = tmp_path / "work"
    for folder, files in {
        "skills/word_count": {"SKILL.md": COUNT_MD, "main.py": COUNT_PY, "stop.txt": "a\n"},
        "skills/shout": {"SKILL.md": SHOUT_MD, "main.js": "console.log({{text}})\n"},
    }.items():
        (work / folder).mkdir(parents=True)
        for name, text in files.items():
            (work / folder / name).write_text(text)
    (work / "skills.json").write_text(json.dumps(["skills/word_count", "skills/shout"]))
    git(work, "init", "--quiet", "-b", "main")
    git(work, "add", ".")
    git(work, "commit", "--quiet", "-m", "two skills")
    (tmp_path / "served").mkdir()
    with GitHttpServer(tmp_path / "served") as server:
        yield server, work, server.publish(work, "skills")


def _preview(page: Any, repository: str, ref: str = "") -> None:
    page.get_by_label("Repository").fill(repository)
    page.get_by_label("Ref").fill(ref)
    page.get_by_role("button", name="Preview").click()


def _apply(page: Any) -> None:
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Apply the import").click()
    expect(page.get_by_role("heading", name="What was done")).to_be_visible()


def test_an_operator_previews_and_applies_a_git_import(
    browser: Browser, published: tuple[GitHttpServer, Path, str]
) -> None:
    server, work, url = published
    page = browser.logged_in("operator")
    page.goto("/skills")
    page.get_by_role("link", name="Import from Git").click()
    expect(page.get_by_role("heading", name="Import skills from Git")).to_be_visible()

    _preview(page, str(work))
    expect(page.locator("#field-repository .field-errors")).to_contain_text("http")
    _preview(page, url, "no-such-branch")
    expect(page.locator("#field-ref .field-errors")).to_contain_text("git checkout failed")

    _preview(page, url)
    create = page.locator("#import-create")
    expect(create.locator("#create-word_count")).to_contain_text("Word count")
    expect(create.locator("#create-word_count")).to_contain_text("skills/word_count + files")
    expect(create.locator("#create-shout")).to_contain_text("disabled")
    page.get_by_text("Program of word_count").click()
    expect(page.locator(".import-code pre").first).to_contain_text("print(len(")
    assert not Skill.objects.exists()
    page.set_viewport_size({"width": 1440, "height": 900})
    screenshot(page, "skill-import-preview-1440")

    _apply(page)
    expect(page.locator("#import-done")).to_contain_text("created")
    word, shout = Skill.objects.get(tool_name="word_count"), Skill.objects.get(tool_name="shout")
    assert (word.source, word.source_ref, word.created_by) == ("git", url, "operator")
    assert word.source_commit == git(work, "rev-parse", "HEAD")
    assert not word.enabled and not shout.enabled and word.archive

    (work / "skills" / "word_count" / "main.py").write_text(COUNT_PY + "print('v2')\n")
    git(work, "commit", "--quiet", "-am", "v2")
    server.publish(work, "skills")
    page.get_by_role("link", name="Import another").click()
    _preview(page, url, "main")
    update = page.locator("#update-word_count")
    expect(update).to_contain_text("code_template")
    expect(update.locator(".diff-add")).to_contain_text(["+print('v2')"])
    expect(page.locator("#import-unchanged")).to_have_text("shout")
    page.set_viewport_size({"width": 390, "height": 844})
    screenshot(page, "skill-import-diff-390")

    _apply(page)
    expect(page.locator("#import-done")).to_contain_text("updated: code_template")
    page.set_viewport_size({"width": 1440, "height": 900})
    screenshot(page, "skill-import-result-1440")
    assert Skill.objects.get(tool_name="word_count").code_template.endswith("print('v2')\n")
    assert not Skill.objects.get(tool_name="word_count").enabled

"""A Deno skill in a real Chromium: the form offers the language, the editor colours its
TypeScript (keywords such as ``interface``, ``//`` comments, placeholders), packages on a Deno
skill are refused at their field, and without them the skill is created as ``deno``."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from skillhub.models import Skill
from tests.ui.conftest import Browser, screenshot

pytestmark = [pytest.mark.ui, pytest.mark.django_db(transaction=True)]

TS_CODE = (
    "interface Named { name: string }\n"
    "// greet in TypeScript\n"
    "const who: Named = { name: {{name}} };\n"
    "console.log(`hello ${who.name}`);\n"
)


def test_an_operator_writes_a_deno_skill_in_the_form(browser: Browser) -> None:
    page = browser.logged_in("admin")
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto("/skills/new")
    language = page.get_by_label("Language")
    expect(language.locator("option[value=deno]")).to_have_text("Deno (TypeScript)")
    page.get_by_label("Tool name").fill("ts_greet")
    page.get_by_label("Title").fill("Greet")
    page.get_by_label("Description").fill("Greets in TypeScript")
    language.select_option("deno")
    page.get_by_label("Input schema").fill(
        '{"type": "object", "properties": {"name": {"type": "string"}}}'
    )
    page.get_by_label("Code template").fill(TS_CODE)
    editor = page.locator(".code-editor")
    expect(editor).to_have_attribute("data-language", "deno")
    expect(editor.locator(".tok-keyword").first).to_have_text("interface")
    expect(editor.locator(".tok-comment")).to_have_text("// greet in TypeScript")
    expect(editor.locator(".tok-placeholder")).to_have_text("{{name}}")
    page.get_by_label("Packages").fill("lodash")
    page.get_by_role("button", name="Create skill").click()
    errors = page.locator("#id_packages_errors")
    expect(errors).to_contain_text("deno skills take no packages")
    assert not Skill.objects.exists()
    screenshot(page, "skill-deno-packages-refused-1440")

    page.get_by_label("Packages").fill("")
    page.get_by_role("button", name="Create skill").click()
    expect(page.locator("h1")).to_contain_text("Greet")
    skill = Skill.objects.get(tool_name="ts_greet")
    assert (skill.language, skill.packages) == ("deno", [])
    assert skill.code_template.replace("\r\n", "\n") == TS_CODE  # a textarea posts CRLF
    expect(page.get_by_text("Deno (TypeScript)").first).to_be_visible()
    screenshot(page, "skill-deno-detail-1440")

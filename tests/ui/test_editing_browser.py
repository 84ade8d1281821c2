"""Editing in a real Chromium: a pattern's policy JSON is checked as it is typed against the
schema the server serves (an unknown key names the allowed ones), its leader and makers are
picked from the employees, and a skill's code gets line numbers and colours (editor.js, a
local file); at 1440 px and on a 390 px phone."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from orchestrator.agents.services import employee_create, model_endpoint_create
from tests.ui.conftest import Browser, screenshot

pytestmark = [pytest.mark.ui, pytest.mark.django_db(transaction=True)]


def test_json_fields_check_as_typed_pickers_offer_employees_and_code_is_highlighted(
    browser: Browser,
) -> None:
    endpoint = model_endpoint_create(name="e-edit", provider="scripted", script="demo")
    for name in ("ada", "bob", "cy"):
        employee_create(username=name, endpoint=endpoint)
    page = browser.logged_in("admin")
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto("/patterns/new")
    expect(page.locator("#employee-names option")).to_have_count(3)
    policy = page.get_by_label("Policy", exact=True)
    check = page.locator("#id_policy-check")
    expect(check).to_contain_text("Allowed keys: approvals, budgets")
    policy.fill(json.dumps({"budget": {"perRun": {}}}))
    expect(check).to_contain_text(
        '/budget: unknown key "budget": allowed keys are approvals, budgets'
    )
    policy.fill(json.dumps({"budgets": {"perRun": {"tokenz": 5}}}))
    expect(check).to_contain_text('/budgets/perRun/tokenz: unknown key "tokenz": allowed keys are')
    policy.fill(json.dumps({"budgets": {"perRun": {"tokens": 5000}}}))
    expect(check).to_have_text("Matches the schema.")
    page.get_by_role("button", name="+ bob").click()
    page.get_by_role("button", name="+ cy").click()
    expect(page.get_by_label("Maker usernames")).to_have_value("bob\ncy")
    screenshot(page, "pattern-editor-1440")

    page.goto("/skills/new")
    page.get_by_label("Language").select_option("python")
    page.get_by_label("Code template").fill("import json\n# say hi\nprint(json.dumps({{name}}))\n")
    editor = page.locator(".code-editor")
    expect(editor.locator(".code-gutter")).to_have_text("1\n2\n3\n4\n")
    expect(editor.locator(".tok-keyword").first).to_have_text("import")
    expect(editor.locator(".tok-comment")).to_have_text("# say hi")
    expect(editor.locator(".tok-placeholder")).to_have_text("{{name}}")
    page.get_by_label("Language").select_option("node")
    expect(editor).to_have_attribute("data-language", "node")
    screenshot(page, "skill-editor-1440")

    page.set_viewport_size({"width": 390, "height": 844})
    for url in ("/patterns/new", "/skills/new"):
        page.goto(url)
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"{url} is {width} px wide on a 390 px phone"
    screenshot(page, "skill-editor-390")

"""A skill's Packages section in a real Chromium: an operator builds the package environment
from a local PEP 503 index on loopback ("Build now"), sees the pinned version, and clears it
after a confirmation ("Clear"); a viewer sees the pins but no buttons."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from skillhub.models import SkillEnvironment
from skillhub.services.skills import skill_create
from tests.support.package_index import PackageServer, package_server
from tests.ui.conftest import Browser, screenshot

pytestmark = [pytest.mark.ui, pytest.mark.django_db(transaction=True)]

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}}


@pytest.fixture
def local_index(settings: Any) -> Iterator[PackageServer]:
    cache = Path(tempfile.mkdtemp(prefix="lw-skill-envs-ui-", dir="/tmp"))
    cache.chmod(0o755)
    with package_server() as server:
        server.add_wheel("tinypkg", "1.0.0", {"tinypkg/__init__.py": b"VALUE = 1\n"})
        settings.SKILLHUB = {
            **settings.SKILLHUB,
            "ENV_DIR": str(cache / "envs"),
            "PIP_INDEX_URL": f"{server.url}/simple",
        }
        yield server
    shutil.rmtree(cache, ignore_errors=True)


def test_an_operator_builds_and_clears_a_skills_package_environment(
    browser: Browser, local_index: PackageServer
) -> None:
    skill_create(
        actor="admin", tool_name="tiny", title="Tiny", language="python", input_schema=SCHEMA,
        code_template="import tinypkg\nprint(tinypkg.VALUE)\n", packages=["tinypkg"],
    )  # fmt: skip
    page = browser.logged_in("operator")
    questions: list[str] = []

    def answer(dialog: object) -> None:
        questions.append(dialog.message)  # type: ignore[attr-defined]
        dialog.accept()  # type: ignore[attr-defined]

    page.on("dialog", answer)
    page.goto("/skills/tiny")
    section = page.locator("#packages")
    expect(section.get_by_role("heading", name="Packages")).to_be_visible()
    expect(section.locator("#env-pins")).to_contain_text("resolved at the first build")
    section.get_by_role("button", name="Build now").click()
    expect(page.locator(".flash")).to_contain_text("Package environment of tiny ready")
    expect(page.locator("#env-pins")).to_have_text("tinypkg==1.0.0")
    expect(page.locator("#packages")).to_contain_text("built on this host")
    screenshot(page, "skill-package-environment")
    page.locator("#packages").get_by_role("button", name="Clear").click()
    expect(page.locator(".flash")).to_contain_text("Package environment of tiny cleared")
    assert questions and "Clear the package environment of tiny?" in questions[0]
    expect(page.locator("#packages")).to_contain_text("not built on this host")
    expect(page.locator("#env-pins")).to_have_text("tinypkg==1.0.0")  # kept for the rebuild
    assert SkillEnvironment.objects.get().status == "cleared"

    viewer = browser.logged_in("viewer")
    viewer.goto("/skills/tiny")
    expect(viewer.locator("#env-pins")).to_have_text("tinypkg==1.0.0")
    expect(viewer.get_by_role("button", name="Build now")).to_have_count(0)

"""Skills directories over the API: a folder under a temporary skills root and a folder of a Git
repository served on loopback are synced into a catalogue (a broken SKILL.md is refused with its
reason), the allowlist and the employees list decide what an employee may load, viewers only
read, and bad input is a 400 problem with a pointer."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from runtime.chat import ChatTurn, chat_invocation
from skillhub.directory_tools import SkillCataloguePrompt, catalogue_block
from skillhub.services.directories import (
    skill_directory_create,
    skill_directory_sync,
    skill_instructions,
)
from tests.knowledge.kb_support import employee
from tests.support.git_server import GitHttpServer, git

pytestmark = pytest.mark.django_db

URL = "/api/v1/skill-directories"
PROBLEM = "application/problem+json"


def skill_md(name: str, description: str, body: str) -> str:
    return f"---\nname: {name}\ndescription: {description}\n---\n{body}\n"


def write_skills(folder: Path) -> None:
    for sub, text in {
        "pdf": skill_md("pdf", "Fill in PDF forms.", "# PDF\n\nUse pdftk to fill forms."),
        "review": skill_md("review", "Review a pull request.", "Read the diff first."),
        "broken": "# No front matter here\n",
    }.items():
        (folder / sub).mkdir(parents=True, exist_ok=True)
        (folder / sub / "SKILL.md").write_text(text)


def problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == PROBLEM
    body: dict[str, Any] = response.json()
    return body


@pytest.fixture
def root(tmp_path: Path, settings: Any) -> Path:
    settings.LOOPWRIGHT_SKILLS_ROOT = str(tmp_path / "skills-root")
    write_skills(tmp_path / "skills-root" / "team")
    return tmp_path / "skills-root"


def test_a_folder_syncs_with_refusals_allowlist_and_roles(
    root: Path, operator_client: APIClient, viewer_client: APIClient
) -> None:
    employee("ada")
    employee("bob")
    body = {"key": "team", "source": "folder", "path": "team", "employees": ["ada"]}
    created = operator_client.post(URL, body, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["catalogue"] == [] and created.json()["synced_at"] is None

    synced = operator_client.post(f"{URL}/team/sync")
    assert synced.status_code == 200, synced.content
    report = synced.json()
    assert (report["added"], report["removed"]) == (["pdf", "review"], [])
    assert report["refused"] == [
        {"path": "broken/SKILL.md", "detail": report["refused"][0]["detail"]}
    ]
    assert "no front matter" in report["refused"][0]["detail"]
    listed = viewer_client.get(f"{URL}/team").json()["catalogue"]
    assert [(s["name"], s["source_path"]) for s in listed] == [
        ("pdf", "pdf/SKILL.md"), ("review", "review/SKILL.md"),
    ]  # fmt: skip

    block = catalogue_block("ada")
    assert "<available_skills>" in block and "- pdf: Fill in PDF forms." in block
    assert "Use pdftk" not in block  # instructions are loaded by the tool, never inlined
    assert catalogue_block("bob") == ""  # not listed: deny by default
    found = skill_instructions("ada", "pdf")
    assert found is not None and found.instructions == "# PDF\n\nUse pdftk to fill forms."

    patched = operator_client.patch(f"{URL}/team", {"skills": ["review"]}, format="json")
    assert patched.status_code == 200, patched.content
    assert skill_instructions("ada", "pdf") is None and "- pdf:" not in catalogue_block("ada")

    (root / "team" / "review" / "SKILL.md").write_text(skill_md("review", "Review.", "New."))
    (root / "team" / "pdf" / "SKILL.md").unlink()
    again = operator_client.post(f"{URL}/team/sync").json()
    assert (again["updated"], again["removed"], again["added"]) == (["review"], ["pdf"], [])

    problem(viewer_client.post(URL, {**body, "key": "other"}, format="json"), 403)
    problem(viewer_client.post(f"{URL}/team/sync"), 403)
    problem(viewer_client.delete(f"{URL}/team"), 403)
    assert operator_client.delete(f"{URL}/team").status_code == 204


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({"key": "x", "source": "folder", "path": "../etc"}, "/path"),
        ({"key": "x", "source": "folder", "path": "a", "employees": ["ghost"]}, "/employees/0"),
        ({"key": "x", "source": "git", "path": ""}, "/repository"),
        ({"key": "x", "source": "folder", "path": "a", "skills": ["no spaces"]}, "/skills/0"),
        ({"key": "Bad Key", "source": "folder", "path": "a"}, "/key"),
    ],
)
def test_bad_input_is_a_problem_with_a_pointer(
    operator_client: APIClient, body: dict[str, Any], pointer: str
) -> None:
    refused = problem(operator_client.post(URL, body, format="json"), 400)
    assert pointer in [e["pointer"] for e in refused["errors"]], refused


def test_a_folder_outside_the_root_is_refused_at_sync(
    root: Path, operator_client: APIClient, tmp_path: Path
) -> None:
    (tmp_path / "elsewhere").mkdir()
    (root / "escape").symlink_to(tmp_path / "elsewhere")
    made = operator_client.post(URL, {"key": "esc", "source": "folder", "path": "escape"},
                                format="json")  # fmt: skip
    assert made.status_code == 201, made.content
    refused = problem(operator_client.post(f"{URL}/esc/sync"), 400)
    assert refused["errors"][0]["pointer"] == "/path"


@pytest.fixture
def served(tmp_path: Path, settings: Any) -> Iterator[tuple[Path, GitHttpServer]]:
    settings.LOOPWRIGHT_OUTBOUND = {
        **settings.LOOPWRIGHT_OUTBOUND, "GIT_SCHEMES": frozenset({"http", "https"})
    }  # fmt: skip
    work = tmp_path / "skills-repo"
    write_skills(work / "skills")
    git(work, "init", "--quiet", "-b", "main")
    git(work, "add", ".")
    git(work, "commit", "--quiet", "-m", "skills")
    (tmp_path / "served").mkdir()
    with GitHttpServer(tmp_path / "served") as server:
        yield work, server


def test_a_git_folder_syncs(operator_client: APIClient, served: tuple[Path, GitHttpServer]) -> None:
    work, server = served
    url = server.publish(work, "skills")
    employee("ada")
    body = {"key": "git-skills", "source": "git", "repository": url, "path": "skills",
            "employees": ["ada"]}  # fmt: skip
    assert operator_client.post(URL, body, format="json").status_code == 201
    report = operator_client.post(f"{URL}/git-skills/sync").json()
    assert report["added"] == ["pdf", "review"] and len(report["refused"]) == 1
    assert report["commit"] == git(work, "rev-parse", "HEAD")
    assert "- review: Review a pull request." in catalogue_block("ada")

    operator_client.patch(f"{URL}/git-skills", {"path": "nope"}, format="json")
    missing = problem(operator_client.post(f"{URL}/git-skills/sync"), 400)
    assert missing["type"].endswith("git-import-error")


def test_the_catalogue_takes_the_employee_s_tools_from_the_request_when_it_has_them(
    root: Path, django_assert_num_queries: Any
) -> None:
    """The run's invocation and the chat pass the tools of the profile they read (a current
    one), so the prompt block does not read the employee again; without them it reads."""
    ada = employee("ada")
    ada.tools = ["skill"]
    ada.save()
    directory = skill_directory_create(key="team", source="folder", path="team", employees=["ada"])
    skill_directory_sync(directory=directory)
    chat = chat_invocation(employee="ada", harness={}, turn=ChatTurn(messages=[], user="alice"))
    prompt = SkillCataloguePrompt()

    read = prompt.prompt_block_here(chat)  # no tools given: the employee's row says
    assert "- pdf: Fill in PDF forms." in read
    with CaptureQueriesContext(connection) as given:
        assert prompt.prompt_block_here(replace(chat, employee_tools=("skill",))) == read
    assert not [q for q in given.captured_queries if "agents_employee" in q["sql"]]
    with django_assert_num_queries(0):  # bound nothing the catalogue needs: nothing to read
        assert prompt.prompt_block_here(replace(chat, employee_tools=("read",))) == ""

"""Git import from a repository this test creates with the ``git`` command: gitListSkills reads
skills.json and SKILL.md front matter, gitSyncSkills shows the diff and applies it only when
asked, a later commit shows up as an update, a local skill of the same name is never
overwritten, and an imported skill runs with its folder's files in the sandbox."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import user_ensure
from skillhub.models import Skill
from skillhub.services.access import Caller
from skillhub.services.executions import execution_request, execution_run
from skillhub.services.skills import skill_create

pytestmark = pytest.mark.django_db

WORD_COUNT_MD = """---
toolName: word_count
title: Word count
description: Counts the words of a text
language: python
timeoutSeconds: 15
autoCall: true
enabled: true
inputSchema:
  type: object
  properties:
    text: {type: string}
  required: [text]
---
Call it with the text to count; it also reads `stopwords.txt`.
"""
WORD_COUNT_PY = (
    "stop = set(open('stopwords.txt').read().split())\n"
    "words = [w for w in {{text}}.split() if w not in stop]\n"
    "print(len(words))\n"
)
SHOUT_MD = """---
toolName: shout
title: Shout
language: node
inputSchema: {"type": "object", "properties": {"text": {"type": "string"}}}
---
"""


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.email=t@example.invalid", "-c", "user.name=t", *args],
        cwd=repo, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "skills-repo"
    (root / "skills" / "word_count").mkdir(parents=True)
    (root / "skills" / "shout").mkdir(parents=True)
    (root / "skills.json").write_text(
        json.dumps({"skills": [{"path": "skills/word_count"}, {"path": "skills/shout"}]})
    )
    (root / "skills" / "word_count" / "SKILL.md").write_text(WORD_COUNT_MD)
    (root / "skills" / "word_count" / "main.py").write_text(WORD_COUNT_PY)
    (root / "skills" / "word_count" / "stopwords.txt").write_text("a the\n")
    (root / "skills" / "shout" / "SKILL.md").write_text(SHOUT_MD)
    (root / "skills" / "shout" / "main.js").write_text("console.log({{text}}.toUpperCase())\n")
    git(root, "init", "--quiet", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "--quiet", "-m", "two skills")
    return root


def sync(client: APIClient, repo: Path, apply: bool) -> dict[str, Any]:
    response = client.post(
        "/api/v1/skills/gitSyncSkills", {"repository": str(repo), "apply": apply}, format="json"
    )
    assert response.status_code == 200, response.content
    return dict(response.json())


def test_git_list_skills_reads_the_manifest_and_front_matter(
    operator_client: APIClient, repo: Path
) -> None:
    response = operator_client.post(
        "/api/v1/skills/gitListSkills", {"repository": str(repo)}, format="json"
    )
    assert response.status_code == 200, response.content
    listed = response.json()
    assert listed["commit"] == git(repo, "rev-parse", "HEAD")
    word, shout = listed["skills"]
    assert word["tool_name"] == "word_count" and word["timeout_seconds"] == 15
    assert word["input_schema"]["required"] == ["text"]
    assert word["instructions"].startswith("Call it with the text")
    assert word["code_template"] == WORD_COUNT_PY and word["archive_sha256"]
    assert (shout["language"], shout["enabled"], shout["archive_sha256"]) == ("node", False, None)
    assert not Skill.objects.exists()


def test_git_sync_shows_the_diff_then_applies_it(operator_client: APIClient, repo: Path) -> None:
    preview = sync(operator_client, repo, apply=False)
    assert [s["tool_name"] for s in preview["create"]] == ["word_count", "shout"]
    assert not Skill.objects.exists()

    applied = sync(operator_client, repo, apply=True)
    assert applied["applied"] is True
    word = Skill.objects.get(tool_name="word_count")
    assert (word.source, word.source_ref, word.source_path) == (
        "git",
        str(repo),
        "skills/word_count",
    )
    assert word.source_commit == git(repo, "rev-parse", "HEAD")
    assert word.enabled and word.auto_call and not Skill.objects.get(tool_name="shout").enabled
    assert sync(operator_client, repo, apply=False)["unchanged"] == ["word_count", "shout"]

    (repo / "skills" / "word_count" / "main.py").write_text(WORD_COUNT_PY + "print('v2')\n")
    git(repo, "commit", "--quiet", "-am", "v2")
    diff = sync(operator_client, repo, apply=False)
    [update] = diff["update"]
    assert update["tool_name"] == "word_count"
    assert list(update["changes"]) == ["code_template"]
    assert update["changes"]["code_template"]["to"].endswith("print('v2')\n")
    assert "v2" not in Skill.objects.get(tool_name="word_count").code_template
    sync(operator_client, repo, apply=True)
    assert Skill.objects.get(tool_name="word_count").code_template.endswith("print('v2')\n")


def test_a_local_skill_of_the_same_name_is_not_overwritten(
    operator_client: APIClient, repo: Path
) -> None:
    skill_create(
        actor="test", tool_name="shout", title="Mine", code_template="print(1)",
        language="python", input_schema={"type": "object", "properties": {}},
    )  # fmt: skip
    result = sync(operator_client, repo, apply=True)
    assert [c["tool_name"] for c in result["conflict"]] == ["shout"]
    assert Skill.objects.get(tool_name="shout").title == "Mine"


@pytest.mark.parametrize(
    ("repository", "status"),
    [("relative/path", 400), ("--upload-pack=touch /tmp/x", 400), ("/nonexistent/repo", 400)],
)
def test_bad_repositories_are_refused(
    operator_client: APIClient, repository: str, status: int
) -> None:
    response = operator_client.post(
        "/api/v1/skills/gitListSkills", {"repository": repository}, format="json"
    )
    assert response.status_code == status
    assert response["Content-Type"] == "application/problem+json"


def test_an_imported_skill_runs_with_its_folder_files(
    operator_client: APIClient, repo: Path
) -> None:
    sync(operator_client, repo, apply=True)
    skill = Skill.objects.get(tool_name="word_count")
    user = user_ensure(username="operator", roles=[Role.OPERATOR])
    execution = execution_request(
        skill=skill, inputs={"text": "the cat sat on a mat"}, caller=Caller.for_user(user),
        origin="test",
    )  # fmt: skip
    done = execution_run(execution_id=execution.id, owner="inline")
    assert done is not None and done.status == "succeeded", done and done.stderr
    assert done.stdout == "4\n"

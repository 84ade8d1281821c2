"""Git import from a repository this test creates with the ``git`` command and serves from a
real HTTP server on loopback (git's dumb protocol; ``http`` is enabled for these tests through
``LOOPWRIGHT_GIT_SCHEMES``): gitListSkills reads skills.json and SKILL.md front matter,
gitSyncSkills shows the diff and applies it only when asked, a later commit shows up as an
update, a local skill of the same name is never overwritten, and an imported skill runs with
its folder's files in the sandbox. The guard's side (schemes, hosts, addresses, redirects,
pinning) is in tests/security/test_p3_ssrf.py; here, what reaches git at all."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
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
from tests.support.git_server import GitHttpServer, git

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


@pytest.fixture
def git_http(settings: Any) -> None:
    """Git import over plain HTTP (the default is https only), for the loopback server."""
    settings.LOOPWRIGHT_OUTBOUND = {
        **settings.LOOPWRIGHT_OUTBOUND, "GIT_SCHEMES": frozenset({"http", "https"})
    }  # fmt: skip


@pytest.fixture
def server(tmp_path: Path) -> Iterator[GitHttpServer]:
    (tmp_path / "served").mkdir()
    with GitHttpServer(tmp_path / "served") as running:
        yield running


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


@pytest.fixture
def url(git_http: None, server: GitHttpServer, repo: Path) -> str:
    return server.publish(repo, "skills")


def sync(client: APIClient, url: str, apply: bool) -> dict[str, Any]:
    response = client.post(
        "/api/v1/skills/gitSyncSkills", {"repository": url, "apply": apply}, format="json"
    )
    assert response.status_code == 200, response.content
    return dict(response.json())


def test_git_list_skills_reads_the_manifest_and_front_matter(
    operator_client: APIClient, repo: Path, url: str, server: GitHttpServer
) -> None:
    response = operator_client.post(
        "/api/v1/skills/gitListSkills", {"repository": url}, format="json"
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
    assert any("/info/refs" in path for path in server.requests)  # over HTTP, for real


def test_git_sync_shows_the_diff_then_applies_it(
    operator_client: APIClient, repo: Path, url: str, server: GitHttpServer
) -> None:
    preview = sync(operator_client, url, apply=False)
    assert [s["tool_name"] for s in preview["create"]] == ["word_count", "shout"]
    assert not Skill.objects.exists()

    applied = sync(operator_client, url, apply=True)
    assert applied["applied"] is True
    word = Skill.objects.get(tool_name="word_count")
    assert (word.source, word.source_ref, word.source_path) == ("git", url, "skills/word_count")
    assert word.source_commit == git(repo, "rev-parse", "HEAD")
    assert word.enabled and word.auto_call and not Skill.objects.get(tool_name="shout").enabled
    assert sync(operator_client, url, apply=False)["unchanged"] == ["word_count", "shout"]

    (repo / "skills" / "word_count" / "main.py").write_text(WORD_COUNT_PY + "print('v2')\n")
    git(repo, "commit", "--quiet", "-am", "v2")
    server.publish(repo, "skills")
    diff = sync(operator_client, url, apply=False)
    [update] = diff["update"]
    assert update["tool_name"] == "word_count"
    assert list(update["changes"]) == ["code_template"]
    assert update["changes"]["code_template"]["to"].endswith("print('v2')\n")
    assert "v2" not in Skill.objects.get(tool_name="word_count").code_template
    sync(operator_client, url, apply=True)
    assert Skill.objects.get(tool_name="word_count").code_template.endswith("print('v2')\n")
    chain = Skill.objects.get(tool_name="word_count").versions.order_by("number")
    assert [(v.kind, v.actor, v.state["source_commit"]) for v in chain] == [
        ("git-sync", "operator", word.source_commit),
        ("git-sync", "operator", git(repo, "rev-parse", "HEAD")),
    ]


def test_a_local_skill_of_the_same_name_is_not_overwritten(
    operator_client: APIClient, url: str
) -> None:
    skill_create(
        actor="test", tool_name="shout", title="Mine", code_template="print(1)",
        language="python", input_schema={"type": "object", "properties": {}},
    )  # fmt: skip
    result = sync(operator_client, url, apply=True)
    assert [c["tool_name"] for c in result["conflict"]] == ["shout"]
    assert Skill.objects.get(tool_name="shout").title == "Mine"


def list_skills(client: APIClient, repository: str) -> Any:
    return client.post("/api/v1/skills/gitListSkills", {"repository": repository}, format="json")


@pytest.mark.parametrize(
    "repository",
    [
        "relative/path", "--upload-pack=touch /tmp/x", "/nonexistent/repo", "{repo}",
        "file://{repo}", "ext::sh -c touch% /tmp/pwned", "fd::3", "git@github.com:o/r.git",
        "ssh://git@github.com/o/r.git", "git://github.com/o/r.git",
    ],
)  # fmt: skip
def test_local_paths_and_other_transports_are_refused(
    operator_client: APIClient, repo: Path, git_http: None, repository: str
) -> None:
    response = list_skills(operator_client, repository.format(repo=repo))
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["errors"][0]["pointer"] == "/repository"
    assert "must be a plain http:// or https:// URL" in problem["detail"]


def test_plain_http_is_refused_unless_the_setting_allows_it(
    operator_client: APIClient, server: GitHttpServer, repo: Path
) -> None:
    url = server.publish(repo, "skills")
    response = list_skills(operator_client, url)
    assert response.status_code == 400
    assert "must be a plain https:// URL (LOOPWRIGHT_GIT_SCHEMES" in response.json()["detail"]
    assert server.requests == []


def test_hosts_outside_the_allowed_list_are_refused(
    operator_client: APIClient, url: str, server: GitHttpServer, settings: Any
) -> None:
    settings.LOOPWRIGHT_OUTBOUND = {
        **settings.LOOPWRIGHT_OUTBOUND, "GIT_HOSTS": frozenset({"*.example.com"})
    }  # fmt: skip
    response = list_skills(operator_client, url)
    assert response.status_code == 400
    assert (
        "127.0.0.1 is not one of the hosts LOOPWRIGHT_GIT_HOSTS allows" in response.json()["detail"]
    )
    assert server.requests == []


def test_a_symlink_in_the_repository_never_reads_a_host_file(
    operator_client: APIClient, git_http: None, server: GitHttpServer, tmp_path: Path
) -> None:
    """A SKILL.md linking to /etc/passwd is checked out as a plain file holding the link."""
    root = tmp_path / "linked"
    (root / "skills" / "x").mkdir(parents=True)
    (root / "skills.json").write_text(json.dumps({"skills": [{"path": "skills/x"}]}))
    os.symlink("/etc/passwd", root / "skills" / "x" / "SKILL.md")
    (root / "skills" / "x" / "main.py").write_text("print(1)\n")
    git(root, "init", "--quiet", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "--quiet", "-m", "link")
    response = list_skills(operator_client, server.publish(root, "linked"))
    assert response.status_code == 400
    assert "SKILL.md has no front matter" in response.json()["detail"]
    assert "root:" not in response.content.decode()


# Transactional: the execution's progress thread writes on a connection of its own, which an
# open test transaction would hold off (SQLite's lock) until its busy timeout.
@pytest.mark.django_db(transaction=True)
def test_an_imported_skill_runs_with_its_folder_files(operator_client: APIClient, url: str) -> None:
    sync(operator_client, url, apply=True)
    skill = Skill.objects.get(tool_name="word_count")
    user = user_ensure(username="operator", roles=[Role.OPERATOR])
    execution = execution_request(
        skill=skill, inputs={"text": "the cat sat on a mat"}, caller=Caller.for_user(user),
        origin="test",
    )  # fmt: skip
    done = execution_run(execution_id=execution.id, owner="inline")
    assert done is not None and done.status == "succeeded", done and done.stderr
    assert done.stdout == "4\n"

"""Deno skills: created over the REST API and run by a real skills worker (TypeScript types
stripped, ``{{placeholders}}`` as JSON literals), declared packages refused at save (nothing
would provide them), imported from Git with ``main.ts`` as their default entry, and listed
like any other skill."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from skillhub.models import Skill
from skillhub.render import literal, render
from tests.skillhub.conftest import SkillsWorker
from tests.support.git_server import GitHttpServer, git

PROBLEM = "application/problem+json"
#: TypeScript (an interface, annotations, a generic) that Deno runs as is, inputs on stdin too.
DENO_GREET = """\
interface Greeting { name: string; times: number }
const input: Greeting = { name: {{name}}, times: {{times}} };
function repeat<T>(value: T, n: number): T[] { return Array.from({ length: n }, () => value); }
const stdin: Greeting = JSON.parse(new TextDecoder().decode(await readAll()));
async function readAll(): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  for await (const chunk of Deno.stdin.readable) chunks.push(chunk);
  return new Uint8Array(chunks.flatMap((c) => [...c]));
}
Deno.mkdirSync("out", { recursive: true });
Deno.writeTextFileSync("out/greeting.json", JSON.stringify({ same: stdin.name === input.name }));
console.log(repeat(`hello ${input.name}`, input.times).join(" | "));
"""
GREET_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "times": {"type": "integer"}},
    "required": ["name", "times"],
}


def deno_body(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "tool_name": "deno_greet",
        "title": "Greet",
        "description": "Greets in TypeScript",
        "code_template": DENO_GREET,
        "language": "deno",
        "input_schema": GREET_SCHEMA,
        "timeout_seconds": 20,
    }
    data.update(overrides)
    return data


@pytest.mark.e2e
@pytest.mark.timeout(600)
@pytest.mark.django_db(transaction=True)
def test_a_deno_skill_created_over_the_api_runs_in_the_skills_worker(
    skills_worker: SkillsWorker, operator_client: APIClient
) -> None:
    created = operator_client.post("/api/v1/skills", deno_body(), format="json")
    assert created.status_code == 201, created.content
    assert created.json()["language"] == "deno"
    name = 'Ada"); Deno.exit(3); ("'  # a literal, never code
    response = operator_client.post(
        "/api/v1/skills/deno_greet/test", {"inputs": {"name": name, "times": 2}}, format="json"
    )
    assert response.status_code == 200, (response.content, skills_worker.log()[-3000:])
    execution = response.json()
    assert execution["status"] == "succeeded", (execution, skills_worker.log()[-3000:])
    assert execution["stdout"] == f"hello {name} | hello {name}\n"
    assert execution["output_files"] == [
        {"name": "greeting.json", "size": 13, "downloadable": True}
    ]
    got = operator_client.get(
        f"/api/v1/skill-executions/{execution['id']}/download", {"name": "greeting.json"}
    )
    assert json.loads(got.content) == {"same": True}
    listed = operator_client.get("/api/v1/skills/mcpListTools").json()
    assert [t["name"] for t in listed] == ["deno_greet"]


@pytest.mark.django_db
def test_packages_on_a_deno_skill_are_refused_at_save(operator_client: APIClient) -> None:
    response = operator_client.post("/api/v1/skills", deno_body(packages=["lodash"]), format="json")
    assert response.status_code == 400 and response["Content-Type"] == PROBLEM
    errors = response.json()["errors"]
    assert [e["pointer"] for e in errors] == ["/packages"]
    assert "deno skills take no packages" in errors[0]["detail"]
    assert not Skill.objects.exists()


@pytest.mark.django_db
def test_an_existing_deno_skill_cannot_gain_packages(operator_client: APIClient) -> None:
    assert operator_client.post("/api/v1/skills", deno_body(), format="json").status_code == 201
    response = operator_client.patch(
        "/api/v1/skills/deno_greet", {"packages": ["zod"]}, format="json"
    )
    assert response.status_code == 400, response.content
    assert [e["pointer"] for e in response.json()["errors"]] == ["/packages"]
    assert Skill.objects.get(tool_name="deno_greet").packages == []


@pytest.mark.django_db
def test_an_unknown_language_is_still_refused(operator_client: APIClient) -> None:
    response = operator_client.post("/api/v1/skills", deno_body(language="bun"), format="json")
    assert response.status_code == 400
    assert "/language" in [e["pointer"] for e in response.json()["errors"]]


def test_deno_placeholders_render_as_json_literals() -> None:
    assert literal("deno", {"a": [1, "x"]}) == literal("node", {"a": [1, "x"]})
    code = render("const v: string = {{v}};", "deno", {"v": "</script>\u2028`${x}`"})
    assert code == 'const v: string = JSON.parse("\\"</script>\\\\u2028`${x}`\\"");'


# --- Git import ---------------------------------------------------------------------------------

DENO_MD = """---
toolName: ts_shout
title: Shout in TypeScript
language: deno
inputSchema: {"type": "object", "properties": {"text": {"type": "string"}}}
---
"""


@pytest.fixture
def deno_repo_url(settings: Any, tmp_path: Path) -> Iterator[str]:
    settings.LOOPWRIGHT_OUTBOUND = {
        **settings.LOOPWRIGHT_OUTBOUND, "GIT_SCHEMES": frozenset({"http", "https"})
    }  # fmt: skip
    root = tmp_path / "deno-repo"
    (root / "skills" / "ts_shout").mkdir(parents=True)
    (root / "skills.json").write_text(json.dumps({"skills": [{"path": "skills/ts_shout"}]}))
    (root / "skills" / "ts_shout" / "SKILL.md").write_text(DENO_MD)
    (root / "skills" / "ts_shout" / "main.ts").write_text(
        "const t: string = {{text}};\nconsole.log(t.toUpperCase());\n"
    )
    git(root, "init", "--quiet", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "--quiet", "-m", "a deno skill")
    (tmp_path / "served").mkdir()
    with GitHttpServer(tmp_path / "served") as server:
        yield server.publish(root, "skills")


@pytest.mark.django_db
def test_a_deno_skill_imports_from_git_with_main_ts_as_its_entry(
    operator_client: APIClient, deno_repo_url: str
) -> None:
    response = operator_client.post(
        "/api/v1/skills/gitSyncSkills", {"repository": deno_repo_url, "apply": True}, format="json"
    )
    assert response.status_code == 200, response.content
    skill = Skill.objects.get(tool_name="ts_shout")
    assert skill.language == "deno" and skill.code_template.startswith("const t: string")

"""Executions through real ``celery worker`` processes on the ``skills`` queue: the API's
``test`` and ``mcpCallTool`` actions with a Python and a Node.js skill, output file download,
and recovery of an execution whose worker was SIGKILLed mid-run (the poller re-queues it)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from skillhub.models import Skill, SkillExecution
from skillhub.services.access import Caller
from skillhub.services.executions import execution_request, executions_recover
from skillhub.services.skills import skill_create
from tests.skillhub.conftest import (
    NODE_UPPER,
    SKILL_QUEUE,
    TEXT,
    SkillsWorker,
    start_skills_worker,
)
from tests.support.workers import wait_for

pytestmark = [
    pytest.mark.one_backend,
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(600),
]
ECHO_FILE = (
    "import json, pathlib\n"
    "n = {{a}} + {{b}}\n"
    "pathlib.Path('out').mkdir(exist_ok=True)\n"
    "pathlib.Path('out/sum.json').write_text(json.dumps({'sum': n}))\n"
    "print(n)\n"
)


def test_a_python_skill_runs_end_to_end_through_the_api(
    skills_worker: SkillsWorker, api_client_for: Callable[[str], APIClient],
    make_skill: Callable[..., Skill],
) -> None:  # fmt: skip
    make_skill(code_template=ECHO_FILE)
    client = api_client_for("operator")
    response = client.post(
        "/api/v1/skills/py_add/test", {"inputs": {"a": 2, "b": 3}}, format="json"
    )
    assert response.status_code == 200, (response.content, skills_worker.log()[-3000:])
    execution = response.json()
    assert execution["status"] == "succeeded" and execution["stdout"] == "5\n"
    assert execution["output_files"] == [{"name": "sum.json", "size": 10, "downloadable": True}]
    got = client.get(f"/api/v1/skill-executions/{execution['id']}/download", {"name": "sum.json"})
    assert got.status_code == 200 and json.loads(got.content) == {"sum": 5}


def test_a_node_skill_runs_through_mcp_call_tool(
    skills_worker: SkillsWorker, api_client_for: Callable[[str], APIClient]
) -> None:
    skill_create(
        actor="test", tool_name="node_upper", title="Upper", description="Upper-cases text",
        code_template=NODE_UPPER, language="node", input_schema=TEXT, timeout_seconds=20,
    )  # fmt: skip
    client = api_client_for("operator")
    tools = client.get("/api/v1/skills/mcpListTools").json()
    [listed] = [tool for tool in tools if tool["name"] == "node_upper"]
    assert (listed["description"], listed["inputSchema"]) == ("Upper-cases text", TEXT)
    assert listed["annotations"]["destructiveHint"] is True  # not auto_call: a write
    response = client.post(
        "/api/v1/skills/mcpCallTool",
        {"name": "node_upper", "arguments": {"text": 'héllo"); process.exit(9); ("'}},
        format="json",
    )
    assert response.status_code == 200, response.content
    result = response.json()
    assert result["isError"] is False, (result, skills_worker.log()[-3000:])
    assert result["content"][0] == {"type": "text", "text": 'HÉLLO"); PROCESS.EXIT(9); ("\n'}
    assert result["content"][1]["text"].startswith("output files: ")
    assert result["structuredContent"]["exit_code"] == 0


def test_an_execution_of_a_killed_worker_is_recovered(
    tmp_path: Path, make_skill: Callable[..., Skill], settings: Any
) -> None:
    # A queue of its own (the module's worker must not take the execution) and a short lease:
    # the skill's timeout (4 s) plus a 1 s margin.
    queue = f"{SKILL_QUEUE}-recovery"
    settings.SKILLHUB = {**settings.SKILLHUB, "QUEUE": queue}
    env = {"LOOPWRIGHT_SKILL_LEASE_MARGIN_SECONDS": "1", "LOOPWRIGHT_SKILL_QUEUE": queue}
    first = start_skills_worker(tmp_path, "doomed", **env)
    survivor: SkillsWorker | None = None
    try:
        skill = make_skill(
            "slow", code_template="import time\ntime.sleep({{a}})\nprint('slept')",
            input_schema={"type": "object", "properties": {"a": {"type": "number"}}},
            timeout_seconds=4,
        )  # fmt: skip
        from orchestrator.accounts.roles import Role
        from orchestrator.accounts.services import user_ensure

        user = user_ensure(username="operator", roles=[Role.OPERATOR])
        execution = execution_request(
            skill=skill, inputs={"a": 2}, caller=Caller.for_user(user), origin="api"
        )
        wait_for(
            lambda: SkillExecution.objects.get(pk=execution.id).status == "running",
            timeout=60, message=first.log()[-3000:],
        )  # fmt: skip
        first.kill()
        # The lease (5 s) expires; the poller puts the execution back and nudges it.
        wait_for(lambda: executions_recover().requeued == [execution.id], timeout=30)
        assert SkillExecution.objects.get(pk=execution.id).status == "queued"
        survivor = start_skills_worker(tmp_path, "survivor", **env)
        wait_for(
            lambda: SkillExecution.objects.get(pk=execution.id).finished,
            timeout=90, message=survivor.log()[-3000:],
        )  # fmt: skip
        done = SkillExecution.objects.get(pk=execution.id)
        assert (done.status, done.stdout, done.attempts) == ("succeeded", "slept\n", 2)
    finally:
        first.kill()
        if survivor is not None:
            survivor.kill()

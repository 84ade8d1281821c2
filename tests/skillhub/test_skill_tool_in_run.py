"""A skill tool inside a run knows its caller from its context, on PostgreSQL as on SQLite.

The run is triggered through the API; a real loops worker drives it with the production
AgentInvoker against a scripted model over loopback HTTP; a real skills worker runs the skills
in the sandbox. The maker calls two inline (``db-zip``) skills through their own
``skill_hub_<toolName>`` tools:

* ``ctx_reverse``, an ``auto_call`` skill (a read-effect tool: where the run's limits allow, it
  runs *before* the model step that made it is written, and that step is written with its
  result), of ``custom`` scope (only an employee that binds its tool may run it);
* ``ctx_add``, a write-effect skill of ``specified`` scope (named employees only).

Both answers must reach the run's transcript (``GET /api/v1/runs/<id>/steps``): a tool that
looked its caller up by the model step's row failed the first one on PostgreSQL with "Skill
tools run only inside a loop run; this call has none."
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from loops.models import LoopRun, RunStatus
from orchestrator.agents.services import employee_create, model_endpoint_create
from skillhub.models import SkillExecution
from skillhub.services.skills import skill_create
from tests.skillhub.conftest import NUMBERS, TEXT, SkillsWorker, skill_worker_env
from tests.support.approvals import LEADER, MAKER, VERIFIER, approval_pattern, http_reply
from tests.support.bash_chaos import PASSED, git_repository, with_autonomy
from tests.support.model_server import ModelServer
from tests.support.workers import WorkerProcess, wait_for

pytestmark = [
    pytest.mark.one_backend,
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(600),
]
REVERSE, ADD = "skill_hub_ctx_reverse", "skill_hub_ctx_add"
WAIT = 240
TERMINAL = (
    RunStatus.SUCCEEDED,
    RunStatus.FAILED,
    RunStatus.WAITING_HUMAN,
    RunStatus.WAITING_APPROVAL,
)
PY_REVERSE = 's = {{text}}\nprint("reversed:", s[::-1])\n'
PY_ADD = "print('sum:', {{a}} + {{b}})\n"


@pytest.fixture
def model() -> Iterator[ModelServer]:
    with ModelServer() as server:
        server.always(http_reply)
        yield server
    server.check()


@pytest.fixture
def team(model: ModelServer, seeded_profiles: None) -> None:
    endpoint = model_endpoint_create(
        name="ctx-loopback", provider="openai", base_url=model.url, model="ctx-script",
        max_retries=1, timeout_seconds=60,
    )  # fmt: skip
    for username in (LEADER, VERIFIER):
        employee_create(username=username, endpoint=endpoint, tools=["read", "list"])
    employee_create(username=MAKER, endpoint=endpoint, tools=["read", REVERSE, ADD])
    skill_create(
        actor="test", tool_name="ctx_reverse", title="Reverse", description="Reverses text",
        code_template=PY_REVERSE, language="python", input_schema=TEXT, timeout_seconds=20,
        auto_call=True, tool_scope="custom",
    )  # fmt: skip
    skill_create(
        actor="test", tool_name="ctx_add", title="Add", description="Adds a and b",
        code_template=PY_ADD, language="python", input_schema=NUMBERS, timeout_seconds=20,
        tool_scope="specified", employees=[MAKER],
    )  # fmt: skip


@pytest.fixture
def loops_worker(tmp_path: Path, team: None) -> Iterator[WorkerProcess]:
    env = skill_worker_env(LOOPWRIGHT_INVOKER="loops.worker.invoker.AgentInvoker")
    worker = WorkerProcess("agent", tmp_path, env).start()
    worker.wait_ready(timeout=90)
    yield worker
    worker.kill()


def _transcript(client: APIClient, run_id: str) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    url: str | None = f"/api/v1/runs/{run_id}/steps"
    while url:
        response = client.get(url)
        assert response.status_code == 200, response.content
        steps.extend(response.data["results"])
        url = response.data.get("next")
    return steps


def test_an_employee_calls_skill_tools_inside_a_run_and_gets_their_output(
    loops_worker: WorkerProcess,
    skills_worker: SkillsWorker,
    api_client_for: Callable[[str], APIClient],
    tmp_path: Path,
) -> None:
    # ctx_add is a write tool: ungated (allowlisted) only from autonomy L2.
    autonomy = with_autonomy("L2", git_repository(tmp_path / "repo"), [REVERSE, ADD])
    approval_pattern("ctx-skills", **autonomy)
    rounds = [[[REVERSE, {"text": "loopwright"}]], [[ADD, {"a": 20, "b": 22}]]]
    operator = api_client_for("operator")
    response = operator.post(
        "/api/v1/patterns/ctx-skills/trigger",
        {"inputs": {"label": "ctx", "rounds": rounds}},
        format="json",
    )
    assert response.status_code == 201, response.content
    run_id = response.data["id"]
    wait_for(
        lambda: LoopRun.objects.get(pk=run_id).status in TERMINAL,
        timeout=WAIT, interval=0.5,
        message=f"{loops_worker.log()[-4000:]}\n{skills_worker.log()[-3000:]}",
    )  # fmt: skip
    steps = _transcript(api_client_for("viewer"), run_id)
    run = LoopRun.objects.get(pk=run_id)
    # L2: the verifier's pass waits for a human to accept the result.
    assert (run.status, run.terminal_reason) == PASSED, (run.status, run.status_reason, steps)

    calls = {s["name"]: s for s in steps if s["kind"] == "tool" and s["role"] == "maker"}
    assert set(calls) == {REVERSE, ADD}, steps
    for name, expected in ((REVERSE, "reversed: thgirwpool"), (ADD, "sum: 42")):
        step = calls[name]
        assert (step["status"], step["error"]) == ("completed", ""), name
        assert step["response"]["content"].strip() == expected, (name, step["response"])
    # The model got both outputs as the calls' results (its final answer repeats them).
    answer = json.dumps([s["response"] for s in steps if s["kind"] == "model"])
    assert "reversed: thgirwpool" in answer and "sum: 42" in answer

    executions = SkillExecution.objects.filter(run_id=run_id).order_by("created_at")
    assert [(e.tool_name, e.status) for e in executions] == [
        ("ctx_reverse", "succeeded"),
        ("ctx_add", "succeeded"),
    ]
    for execution in executions:
        # Attributed from the invocation the call's context carried.
        assert execution.origin == "agent" and execution.principal == f"employee:{MAKER}"
        assert (
            execution.idempotency_key
            == calls[f"skill_hub_{execution.tool_name}"]["idempotency_key"]
        )

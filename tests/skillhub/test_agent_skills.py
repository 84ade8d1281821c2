"""Skills as agent tools, end to end: a loop run driven by a real worker with the production
AgentInvoker against a scripted model over loopback HTTP; the maker calls a Python skill and a
Node.js skill through their own ``skill_hub_<toolName>`` tools and again through
``skill_hub_execute``; a real skills worker runs them in the sandbox and the results come back
to the model as tool results. A skill call the harness gates parks the run as an approval."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loops.models import ActionApproval, LoopRun, LoopStep, RunStatus
from loops.services.runs import run_trigger
from orchestrator.agents.services import employee_create, model_endpoint_create
from skillhub.models import SkillExecution
from skillhub.services.skills import skill_create
from tests.skillhub.conftest import (
    NODE_UPPER,
    NUMBERS,
    PY_ADD,
    TEXT,
    SkillsWorker,
    skill_worker_env,
)
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
SKILL_TOOLS = ["skill_hub_py_add", "skill_hub_node_upper", "skill_hub_execute"]
WAIT = 240
TERMINAL = (
    RunStatus.SUCCEEDED,
    RunStatus.FAILED,
    RunStatus.WAITING_HUMAN,
    RunStatus.WAITING_APPROVAL,
)


@pytest.fixture
def model() -> Iterator[ModelServer]:
    with ModelServer() as server:
        server.always(http_reply)
        yield server
    server.check()


@pytest.fixture
def team(model: ModelServer, seeded_profiles: None) -> None:
    endpoint = model_endpoint_create(
        name="skills-loopback", provider="openai", base_url=model.url, model="skills-script",
        max_retries=1, timeout_seconds=60,
    )  # fmt: skip
    for username in (LEADER, VERIFIER):
        employee_create(username=username, endpoint=endpoint, tools=["read", "list"])
    employee_create(username=MAKER, endpoint=endpoint, tools=["read", *SKILL_TOOLS])
    skill_create(
        actor="test", tool_name="py_add", title="Add", description="Adds a and b",
        code_template=PY_ADD, language="python", input_schema=NUMBERS, timeout_seconds=20,
    )  # fmt: skip
    skill_create(
        actor="test", tool_name="node_upper", title="Upper", description="Upper-cases text",
        code_template=NODE_UPPER, language="node", input_schema=TEXT, timeout_seconds=20,
        tool_scope="specified", employees=[MAKER],
    )  # fmt: skip


@pytest.fixture
def loops_worker(tmp_path: Path, team: None) -> Iterator[WorkerProcess]:
    env = skill_worker_env(LOOPWRIGHT_INVOKER="loops.worker.invoker.AgentInvoker")
    worker = WorkerProcess("agent", tmp_path, env).start()
    worker.wait_ready(timeout=90)
    yield worker
    worker.kill()


def _wait_terminal(run_id: Any, worker: WorkerProcess, skills: SkillsWorker) -> LoopRun:
    wait_for(
        lambda: LoopRun.objects.get(pk=run_id).status in TERMINAL,
        timeout=WAIT, interval=0.5,
        message=f"{worker.log()[-4000:]}\n{skills.log()[-3000:]}",
    )  # fmt: skip
    return LoopRun.objects.get(pk=run_id)


def _tool_results(run_id: Any) -> dict[str, Any]:
    steps = LoopStep.objects.filter(run_id=run_id, kind="tool", role="maker").order_by("seq")
    return {f"{s.name}:{s.seq}": s.response for s in steps}


def test_an_agent_runs_a_python_and_a_node_skill_through_its_tools(
    loops_worker: WorkerProcess, skills_worker: SkillsWorker, tmp_path: Path
) -> None:
    # Skill tools are write tools: ungated (allowlisted) only from autonomy L2.
    autonomy = with_autonomy("L2", git_repository(tmp_path / "repo"), SKILL_TOOLS)
    pattern = approval_pattern("skills-agent", **autonomy)
    rounds = [
        [["skill_hub_py_add", {"a": 2, "b": 3}], ["skill_hub_node_upper", {"text": "hi there"}]],
        [["skill_hub_execute", {"toolName": "py_add", "inputs": {"a": 40, "b": 2}}]],
        [["skill_hub_py_add", {"a": "not a number"}]],
    ]
    run = run_trigger(pattern=pattern, actor="test", inputs={"label": "s", "rounds": rounds})
    done = _wait_terminal(run.id, loops_worker, skills_worker)
    results = json.dumps(_tool_results(run.id))
    # L2: the verifier's pass waits for a human to accept the result.
    assert (done.status, done.terminal_reason) == PASSED, (done.status, done.status_reason, results)

    executions = list(SkillExecution.objects.filter(run_id=run.id).order_by("created_at"))
    assert [(e.tool_name, e.status, e.stdout) for e in executions] == [
        ("py_add", "succeeded", "5\n"),
        ("node_upper", "succeeded", "HI THERE\n"),
        ("py_add", "succeeded", "42\n"),
    ] or sorted((e.tool_name, e.stdout) for e in executions) == [
        ("node_upper", "HI THERE\n"), ("py_add", "42\n"), ("py_add", "5\n"),
    ]  # fmt: skip
    for execution in executions:
        assert execution.origin == "agent" and execution.principal == f"employee:{MAKER}"
        assert execution.idempotency_key and execution.idempotency_key.startswith(str(run.id))
    assert "HI THERE" in results and "42" in results
    # The invalid arguments never reached a worker: the model got an actionable error instead.
    assert "not of type 'integer'" in results
    assert len(executions) == 3


def test_a_skill_call_the_harness_gates_parks_the_run_as_an_approval(
    loops_worker: WorkerProcess, skills_worker: SkillsWorker
) -> None:
    pattern = approval_pattern("skills-gated")
    rounds = [[["skill_hub_py_add", {"a": 1, "b": 1}]]]
    run = run_trigger(pattern=pattern, actor="test", inputs={"label": "g", "rounds": rounds})
    done = _wait_terminal(run.id, loops_worker, skills_worker)
    assert done.status == RunStatus.WAITING_APPROVAL, done.status_reason
    [approval] = ActionApproval.objects.filter(run_id=run.id)
    assert (approval.tool_name, approval.arguments) == ("skill_hub_py_add", {"a": 1, "b": 1})
    assert not SkillExecution.objects.filter(run_id=run.id).exists()


def test_a_skill_that_requires_review_parks_even_when_allowlisted_and_runs_once_approved(
    loops_worker: WorkerProcess, skills_worker: SkillsWorker, tmp_path: Path
) -> None:
    from loops.services.approvals import approval_decide
    from orchestrator.accounts.roles import Role
    from orchestrator.accounts.services import user_ensure
    from skillhub.models import Skill, SkillLoopConfig

    SkillLoopConfig.objects.create(
        skill=Skill.objects.get(tool_name="py_add"),
        review_prompt="Check that the numbers are small.",
    )
    autonomy = with_autonomy("L2", git_repository(tmp_path / "repo"), SKILL_TOOLS)
    pattern = approval_pattern("skills-review", **autonomy)
    rounds = [
        [["skill_hub_execute", {"toolName": "py_add", "inputs": {"a": 1}}]],
        [["skill_hub_py_add", {"a": 3, "b": 4}]],
    ]
    run = run_trigger(pattern=pattern, actor="test", inputs={"label": "r", "rounds": rounds})
    parked = _wait_terminal(run.id, loops_worker, skills_worker)
    assert parked.status == RunStatus.WAITING_APPROVAL
    [approval] = ActionApproval.objects.filter(run_id=run.id)
    assert approval.tool_name == "skill_hub_py_add"
    assert "Check that the numbers are small." in approval.reason
    assert not SkillExecution.objects.filter(run_id=run.id).exists()
    # The generic tool could not bypass the review: the model was told to use the skill's tool.
    assert "requires human review" in json.dumps(_tool_results(run.id))

    approver = user_ensure(username="reviewer", roles=[Role.APPROVER])
    approval_decide(approval_id=approval.id, user=approver, decision="approve")
    wait_for(
        lambda: LoopRun.objects.get(pk=run.id).status == PASSED[0],
        timeout=WAIT, interval=0.5,
        message=f"{loops_worker.log()[-4000:]}\n{skills_worker.log()[-3000:]}",
    )  # fmt: skip
    [execution] = SkillExecution.objects.filter(run_id=run.id)
    assert (execution.status, execution.stdout) == ("succeeded", "7\n")
    assert execution.idempotency_key and f"approval:{approval.id}" in execution.idempotency_key

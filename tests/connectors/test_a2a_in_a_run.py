"""An external A2A agent inside a durable run, with real workers (the production AgentInvoker)
and a real ``a2a-sdk`` agent on loopback: the maker calls ``a2a__helper``; the worker is
SIGKILLed while the remote task is working; the worker that resumes the run follows the same
task (the agent received exactly one message) and its answer becomes the call's result; a run
cancelled while the remote task works cancels that task; an agent that asks for input parks the
run with the question in the approvals inbox, and the answer given through the API goes to the
same remote task."""

from __future__ import annotations

import copy
import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.a2a_services import a2a_agent_create
from connectors.models import A2ACall
from harness.services import profile_create
from loops.models import LoopRun, LoopStep, RunStatus
from loops.services.runs import run_act, run_trigger
from orchestrator.agents.services import employee_create, model_endpoint_create
from tests.e2e.conftest import start_beat, start_worker
from tests.support.a2a_agent import AgentLog
from tests.support.approvals import (
    LEADER,
    MAKER,
    PLAN,
    VERDICT,
    VERIFIER,
    approval_pattern,
    role_of,
    tool_results,
)
from tests.support.bash_chaos import PASSED, git_repository, with_autonomy
from tests.support.chaos import log_tails
from tests.support.model_server import Completion, ModelServer, RecordedRequest
from tests.support.workers import WorkerProcess, wait_for

pytestmark = [
    pytest.mark.one_backend,
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
    pytest.mark.timeout(600),
]
AGENT = {"LOOPWRIGHT_INVOKER": "loops.worker.invoker.AgentInvoker"}
TOOL = "a2a__helper"
WAIT = int(__import__("os").environ.get("LW_MCP_WAIT", "240"))


def script(request: RecordedRequest) -> Completion:
    """Leader plans; the maker asks the agent for slow work once, then reports its answer; the
    verifier passes."""
    messages = request.body["messages"]
    role = role_of(messages)
    if role == "leader":
        return Completion(content=json.dumps(PLAN))
    if role == "verifier":
        return Completion(content=json.dumps(VERDICT))
    results = tool_results(messages)
    offered = {t["function"]["name"] for t in request.body.get("tools") or []}
    if TOOL not in offered:
        return Completion(content=f"Not offered the agent, only {sorted(offered)}")
    if not results:
        said = json.dumps(messages)
        work = "ask" if "[ask]" in said else "slow 60" if "[long]" in said else "slow 12"
        return Completion(tool_calls=[(TOOL, json.dumps({"message": work}))])
    return Completion(content="Done: " + " | ".join(results))


@pytest.fixture
def pattern(helper_agent: tuple[str, AgentLog], tmp_path: Path) -> Iterator[Any]:
    with ModelServer() as model:
        model.always(script)
        endpoint = model_endpoint_create(
            name="a2a-loopback", provider="openai", base_url=model.url, model="a2a-script",
            max_retries=0, timeout_seconds=120,
        )  # fmt: skip
        seeds = importlib.import_module("harness.migrations.0002_seed_profiles").SEEDS
        settings = copy.deepcopy(seeds["default"]["settings"])
        settings["isolation"]["allowedConnectors"] = ["helper"]
        # The seeded profile restricts the network: the server on loopback must be listed.
        settings["isolation"]["allowedHosts"] = ["127.0.0.1"]
        profile_create(tag="with-helper", settings=settings, created_by="test")
        a2a_agent_create(name="helper", card_url=helper_agent[0], timeout_seconds=120)
        employee_create(username=LEADER, endpoint=endpoint, tools=["read", "list"])
        employee_create(username=MAKER, endpoint=endpoint, tools=[TOOL], harness_tag="with-helper")
        employee_create(username=VERIFIER, endpoint=endpoint, tools=["read"])
        # The agent's tier is write: at L2 the pattern's autoAllowlist lets it run ungated.
        fields = with_autonomy("L2", git_repository(tmp_path / "repo"), [TOOL])
        yield approval_pattern(
            "a2a-run", verifier_username=VERIFIER, maker_harness_tag="with-helper", **fields
        )
    model.check()


def _status(run: Any) -> str:
    return str(LoopRun.objects.get(pk=run.id).status)


def test_a_question_of_the_agent_is_answered_through_the_approvals_inbox(
    tmp_path: Path,
    workers: list[WorkerProcess],
    helper_agent: tuple[str, AgentLog],
    pattern: Any,
    api_client_for: Any,
) -> None:
    log = helper_agent[1]
    first = start_worker(workers, tmp_path, "first", **AGENT)
    run = run_trigger(pattern=pattern, actor="operator", inputs={"label": "[ask]"})
    wait_for(
        lambda: _status(run) in (RunStatus.WAITING_APPROVAL, RunStatus.FAILED),
        timeout=WAIT, interval=0.2, message=log_tails(workers),
    )  # fmt: skip
    first.kill()  # the question outlives the worker that heard it: it is in the database
    approver = api_client_for("approver")
    [asked] = approver.get(f"/api/v1/approvals?run={run.id}&status=pending").json()["results"]
    assert (asked["kind"], asked["tool_name"]) == ("input", TOOL)
    assert asked["reason"] == "A2A agent helper asks: Which colour?"
    [call] = A2ACall.objects.all()
    assert call.state == "input-required" and log.texts() == ["ask"]
    refused = approver.post(
        f"/api/v1/approvals/{asked['id']}/decide", {"decision": "approve"}, format="json"
    )
    assert refused.status_code == 400 and "answer it" in refused.json()["detail"]
    answered = approver.post(
        f"/api/v1/approvals/{asked['id']}/decide",
        {"decision": "answer", "answer": "blue"},
        format="json",
    )
    assert answered.status_code == 200, answered.content
    assert (answered.json()["status"], answered.json()["answer"]) == ("approved", "blue")
    start_worker(workers, tmp_path, "second", **AGENT)
    wait_for(
        lambda: _status(run) in (RunStatus.WAITING_HUMAN, RunStatus.SUCCEEDED, RunStatus.FAILED),
        timeout=WAIT, interval=0.5, message=log_tails(workers),
    )  # fmt: skip
    final = LoopRun.objects.get(pk=run.id)
    assert (final.status, final.terminal_reason) == PASSED, (final.status, final.failure_reason)
    call.refresh_from_db()
    assert log.messages == [("ask", call.task_id), ("blue", call.task_id)]  # one task, two turns
    assert (call.state, log.ended) == ("completed", {call.task_id: "completed"})
    [step] = LoopStep.objects.filter(run=run, name=TOOL)
    assert (step.status, step.response["content"]) == ("completed", "you said: blue")


def test_a_worker_killed_while_the_remote_task_works_resumes_it_without_resending(
    tmp_path: Path,
    workers: list[WorkerProcess],
    procs: list[Any],
    helper_agent: tuple[str, AgentLog],
    pattern: Any,
) -> None:
    log = helper_agent[1]
    start_beat(procs, tmp_path, 1.0)  # the reaper: a dead worker's run is claimed again
    first = start_worker(workers, tmp_path, "first", **AGENT)
    run = run_trigger(pattern=pattern, actor="operator", inputs={"label": "a2a"})
    wait_for(
        lambda: A2ACall.objects.exclude(task_id="").exists() or _status(run) == RunStatus.FAILED,
        timeout=WAIT, interval=0.2, message=log_tails(workers),
    )  # fmt: skip
    [call] = A2ACall.objects.all()
    assert call.idempotency_key.startswith(f"{run.id}:")
    first.kill()
    assert call.task_id not in log.ended  # still working when the worker died
    start_worker(workers, tmp_path, "second", **AGENT)
    wait_for(
        lambda: _status(run) in (RunStatus.WAITING_HUMAN, RunStatus.SUCCEEDED, RunStatus.FAILED),
        timeout=WAIT, interval=0.5, message=log_tails(workers),
    )  # fmt: skip
    final = LoopRun.objects.get(pk=run.id)
    assert (final.status, final.terminal_reason) == PASSED, (final.status, final.failure_reason)
    assert log.texts() == ["slow 12"]  # exactly one message: the second worker followed it
    assert log.ended == {call.task_id: "completed"}
    [step] = LoopStep.objects.filter(run=run, name=TOOL)
    assert step.status == "completed", (step.status, step.error, step.response)
    assert step.response["content"] == "slow done"
    assert A2ACall.objects.get(pk=call.pk).state == "completed"


def test_a_run_cancelled_while_the_agent_waits_for_an_answer_cancels_the_remote_task(
    tmp_path: Path,
    workers: list[WorkerProcess],
    helper_agent: tuple[str, AgentLog],
    pattern: Any,
    api_client_for: Any,
) -> None:
    log = helper_agent[1]
    start_worker(workers, tmp_path, "only", **AGENT)
    run = run_trigger(pattern=pattern, actor="operator", inputs={"label": "[ask]"})
    wait_for(
        lambda: _status(run) in (RunStatus.WAITING_APPROVAL, RunStatus.FAILED),
        timeout=WAIT, interval=0.2, message=log_tails(workers),
    )  # fmt: skip
    [call] = A2ACall.objects.all()
    assert call.state == "input-required" and log.ended == {}
    cancelled = api_client_for("operator").post(f"/api/v1/runs/{run.id}/cancel", {}, format="json")
    assert cancelled.status_code == 200, cancelled.content
    # No call is running to cancel the task: the ended run hands it to a worker.
    wait_for(lambda: call.task_id in log.ended, timeout=WAIT, interval=0.2,
             message=log_tails(workers))  # fmt: skip
    assert log.ended == {call.task_id: "canceled"} and log.texts() == ["ask"]
    # The worker records the state once the agent has answered the cancel (after its log).
    wait_for(lambda: A2ACall.objects.get(pk=call.pk).state == "canceled", timeout=WAIT,
             interval=0.2, message=log_tails(workers))  # fmt: skip


def test_cancelling_the_run_cancels_the_remote_task(
    tmp_path: Path,
    workers: list[WorkerProcess],
    procs: list[Any],
    helper_agent: tuple[str, AgentLog],
    pattern: Any,
) -> None:
    log = helper_agent[1]
    start_worker(workers, tmp_path, "only", **AGENT)
    run = run_trigger(pattern=pattern, actor="operator", inputs={"label": "[long]"})
    wait_for(
        lambda: A2ACall.objects.exclude(task_id="").exists() or _status(run) == RunStatus.FAILED,
        timeout=WAIT, interval=0.2, message=log_tails(workers),
    )  # fmt: skip
    [call] = A2ACall.objects.all()
    run_act(run_id=run.id, action="cancel", actor="operator", reason="enough")
    wait_for(
        lambda: call.task_id in log.ended, timeout=60, interval=0.2, message=log_tails(workers)
    )
    assert log.ended == {call.task_id: "canceled"} and log.texts() == ["slow 60"]
    assert _status(run) == RunStatus.CANCELED
    wait_for(lambda: A2ACall.objects.get(pk=call.pk).state == "canceled", timeout=10)

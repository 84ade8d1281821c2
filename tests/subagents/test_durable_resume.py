"""A worker SIGKILLed in the middle of a sub-agent: another worker resumes the child from its
journal (its finished tool call is not run again, its conversation is rebuilt) and the parent
does not dispatch a new child.

Real parts: two ``celery worker`` processes with the production AgentInvoker (which registers
the sub-agent and todo tools and scopes each invocation), ``celery beat`` running the reaper,
the loopback model server. The model server holds the child's request that carries its ``todo`` result: the
child's model and tool steps are persisted, the parent's dispatch step is ``started``; the
first worker is killed there.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loops.models import LoopRun, LoopStep, RunStatus
from loops.services.runs import run_trigger
from orchestrator.agents.services import (
    employee_create,
    model_endpoint_create,
    sub_agent_binding_create,
)
from tests.e2e.conftest import start_beat, start_worker
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
from tests.support.chaos import log_tails, owner_prefix
from tests.support.model_server import Completion, Hangup, ModelServer, RecordedRequest
from tests.support.workers import WorkerProcess, wait_for

pytestmark = [
    pytest.mark.one_backend,
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
    pytest.mark.timeout(600),
]
AGENT = {"LOOPWRIGHT_INVOKER": "loops.worker.invoker.AgentInvoker"}
HELPER = "sub-helper"
WAIT = 240


class Script:
    """Leader plans; the maker dispatches one task to the helper, then reports its
    conclusion; the helper adds a todo item, then concludes; the verifier passes. The
    helper's first request after its todo call is held (the worker is killed meanwhile)."""

    def __init__(self) -> None:
        self.child_first: list[RecordedRequest] = []
        self.child_after_tool: list[RecordedRequest] = []
        self.holding = threading.Event()
        self.release = threading.Event()

    def __call__(self, request: RecordedRequest) -> Any:
        messages = request.body["messages"]
        system = str(messages[0].get("content"))
        results = tool_results(messages)
        if "You are a sub-agent" in system:
            if not results:
                self.child_first.append(request)
                return Completion(tool_calls=[("todo", json.dumps({"add": ["look around"]}))])
            self.child_after_tool.append(request)
            if len(self.child_after_tool) == 1:
                self.holding.set()
                self.release.wait(timeout=120)
                return Hangup()
            return Completion(content="child conclusion", usage=(40, 9))
        role = role_of(messages)
        if role == "leader":
            return Completion(content=json.dumps(PLAN))
        if role == "verifier":
            return Completion(content=json.dumps(VERDICT))
        if not results:
            task = {"employee": HELPER, "task": "Look around and conclude."}
            return Completion(tool_calls=[("dispatch_sub_agent_task", json.dumps(task))])
        return Completion(content="Done: " + " | ".join(results))


@pytest.fixture
def script() -> Script:
    return Script()


@pytest.fixture
def model(script: Script) -> Iterator[ModelServer]:
    with ModelServer() as server:
        server.always(script)
        yield server
        script.release.set()
    server.check()


@pytest.fixture
def pattern(model: ModelServer, tmp_path: Path) -> Any:
    endpoint = model_endpoint_create(
        name="sub-loopback",
        provider="openai",
        base_url=model.url,
        model="sub-script",
        max_retries=0,
        timeout_seconds=120,
    )
    employee_create(username=LEADER, endpoint=endpoint, tools=["read", "list"])
    boss = employee_create(username=MAKER, endpoint=endpoint, tools=["dispatch_sub_agent_task"])
    helper = employee_create(username=HELPER, endpoint=endpoint, tools=["todo"])
    employee_create(username=VERIFIER, endpoint=endpoint, tools=["read"])
    sub_agent_binding_create(parent=boss, child=helper)
    # The dispatch tool is a write tool: at L2 the pattern may waive its human gate.
    fields = with_autonomy("L2", git_repository(tmp_path / "repo"), ["dispatch_sub_agent_task"])
    return approval_pattern("sub-resume", verifier_username=VERIFIER, **fields)


def test_a_worker_killed_mid_sub_agent_resumes_the_child_without_redispatching(
    tmp_path: Path,
    workers: list[WorkerProcess],
    procs: list[Any],
    script: Script,
    pattern: Any,
) -> None:
    start_beat(procs, tmp_path, 1.0)
    first = start_worker(workers, tmp_path, "first", **AGENT)
    run = run_trigger(pattern=pattern, actor="operator", inputs={"label": "sub"})

    assert script.holding.wait(timeout=WAIT), log_tails(workers)
    [dispatch] = LoopStep.objects.filter(run=run, name="dispatch_sub_agent_task")
    assert (dispatch.invocation, dispatch.status) == ("maker:0", "started")
    child = f"maker:0/sub:{dispatch.request['model_seq']}.0"
    [todo] = LoopStep.objects.filter(run=run, name="todo")
    assert (todo.invocation, todo.status) == (child, "completed")
    assert LoopRun.objects.get(pk=run.id).lease_owner.startswith(owner_prefix(first))
    first.kill()
    killed_at = time.monotonic()
    script.release.set()

    second = start_worker(workers, tmp_path, "second", **AGENT)
    wait_for(
        lambda: (
            LoopRun.objects.get(pk=run.id).status
            in (RunStatus.WAITING_HUMAN, RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELED)
        ),
        timeout=WAIT,
        interval=0.5,
        message=log_tails([*workers, *procs]),
    )
    final = LoopRun.objects.get(pk=run.id)
    assert (final.status, final.terminal_reason) == PASSED, (
        final.status,
        final.failure_reason,
        log_tails(workers),
    )
    # The parent's dispatch was re-issued in place (one step, now completed with the child's
    # conclusion); no second child was dispatched.
    steps = list(LoopStep.objects.filter(run=run, name="dispatch_sub_agent_task"))
    assert [(s.seq, s.status) for s in steps] == [(dispatch.seq, "completed")]
    assert steps[0].response["content"].endswith("concluded:\nchild conclusion")
    invocations = set(LoopStep.objects.filter(run=run).values_list("invocation", flat=True))
    assert {i for i in invocations if "/sub:" in i} == {child}
    # The child resumed from its journal: its todo call ran once, its first request was made
    # once, and the request after the todo result was sent again by the second worker.
    assert list(LoopStep.objects.filter(run=run, name="todo").values_list("seq", flat=True)) == [
        todo.seq
    ]
    assert len(script.child_first) == 1
    assert len(script.child_after_tool) == 2
    assert script.child_after_tool[1].received_at > killed_at - 1
    resent = [tool_results(r.body["messages"]) for r in script.child_after_tool]
    assert resent[0] == resent[1] == [todo.response["content"]]
    # The child's model usage is the run's: its steps carry their tokens.
    child_models = LoopStep.objects.filter(run=run, invocation=child, kind="model")
    assert sum(s.tokens_in for s in child_models) >= 40
    assert second.alive()

"""A worker SIGKILLed between a tool's completion and the next model step: another worker
process resumes the run from its persisted steps without running that tool again.

Real parts: two ``celery worker`` processes with the production AgentInvoker, ``celery beat``
running the reaper, the loopback OpenAI-compatible model server, and the builtin ``bash`` tool
in a real sandbox whose side effect (a line appended to a file in the run's workspace) is
counted. The model server holds the maker's first request that carries the tool result: at
that moment the tool step is persisted ``completed`` and the next model step has not started
returning, which is exactly where the first worker is killed.
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
from loops.services.runs import run_act, run_trigger
from loops.services.workspaces import workspace_path
from orchestrator.agents.services import employee_create, model_endpoint_create
from tests.e2e.conftest import start_beat, start_worker
from tests.support.approvals import (
    LEADER,
    MAKER,
    PLAN,
    VERDICT,
    approval_pattern,
    role_of,
    tool_results,
)
from tests.support.bash_chaos import PASSED, autonomous_on, git_repository
from tests.support.chaos import log_tails, owner_prefix
from tests.support.model_server import Completion, Hangup, ModelServer, RecordedRequest
from tests.support.workers import WorkerProcess, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
    pytest.mark.timeout(600),
]
AGENT = {"LOOPWRIGHT_INVOKER": "loops.worker.invoker.AgentInvoker"}
VERIFIER = "crash-verifier"
COMMAND = "echo ran >> effects.log; wc -l < effects.log"
WAIT = 240


class CrashScript:
    """The model: leader plans, maker calls ``bash`` once then reports, verifier passes.

    The first maker request carrying a tool result is held (the worker is killed meanwhile)
    and then hung up on; later ones get the final answer.
    """

    def __init__(self) -> None:
        self.post_tool: list[RecordedRequest] = []
        self.holding = threading.Event()
        self.release = threading.Event()

    def __call__(self, request: RecordedRequest) -> Any:
        messages = request.body["messages"]
        role = role_of(messages)
        if role == "leader":
            return Completion(content=_json(PLAN))
        if role == "verifier":
            return Completion(content=_json(VERDICT))
        results = tool_results(messages)
        if not results:
            call = {
                "id": "call_bash_1",
                "type": "function",
                "function": {"name": "bash", "arguments": _json({"command": COMMAND})},
            }
            return Completion(content=None, tool_calls=[call])
        self.post_tool.append(request)
        if len(self.post_tool) == 1:
            self.holding.set()
            self.release.wait(timeout=120)
            return Hangup()
        return Completion(content="Done: " + " | ".join(results))


def _json(value: Any) -> str:
    return json.dumps(value)


@pytest.fixture
def script() -> CrashScript:
    return CrashScript()


@pytest.fixture
def model(script: CrashScript) -> Iterator[ModelServer]:
    with ModelServer() as server:
        server.always(script)
        yield server
        script.release.set()
    server.check()


@pytest.fixture
def pattern(model: ModelServer, tmp_path: Path) -> Any:
    endpoint = model_endpoint_create(
        name="crash-loopback",
        provider="openai",
        base_url=model.url,
        model="crash-script",
        max_retries=0,
        timeout_seconds=120,
    )
    employee_create(username=LEADER, endpoint=endpoint, tools=["read", "list"])
    employee_create(username=MAKER, endpoint=endpoint, tools=["bash", "read"])
    employee_create(username=VERIFIER, endpoint=endpoint, tools=["read"])
    # bash is an external-effect (high-risk) tool, gated by default: the pattern waives the
    # human gate, which only autonomy L3 (a repository identity and a worktree) allows.
    return approval_pattern(
        "crash-resume",
        verifier_username=VERIFIER,
        **autonomous_on(git_repository(tmp_path / "repo")),
    )


def test_a_run_killed_after_a_tool_completed_resumes_elsewhere_without_rerunning_it(
    tmp_path: Path,
    workers: list[WorkerProcess],
    procs: list[Any],
    script: CrashScript,
    pattern: Any,
) -> None:
    start_beat(procs, tmp_path, 1.0)
    first = start_worker(workers, tmp_path, "first", **AGENT)
    run = run_trigger(pattern=pattern, actor="operator", inputs={"label": "crash"})

    assert script.holding.wait(timeout=WAIT), log_tails(workers)
    # The tool step is persisted as completed before the next model call went out.
    [bash_step] = LoopStep.objects.filter(run=run, kind="tool", name="bash")
    assert bash_step.status == "completed"
    effects = workspace_path(run.id) / "effects.log"
    assert effects.read_text() == "ran\n"
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
    # At L3 the verifier's pass waits for a human to accept the result.
    assert (final.status, final.terminal_reason) == PASSED, (final.status, log_tails(workers))
    assert run_act(run_id=run.id, action="accept", actor="operator").status == RunStatus.SUCCEEDED

    # The tool ran once: one effect, one tool step, untouched since before the kill.
    assert effects.read_text() == "ran\n"
    steps = list(LoopStep.objects.filter(run=run, kind="tool", name="bash"))
    assert [(s.seq, s.status) for s in steps] == [(bash_step.seq, "completed")]
    assert steps[0].response == bash_step.response
    assert "stdout:\n1" in steps[0].response["content"]
    # The second worker rebuilt the conversation from the steps: its model request carries
    # the recorded tool result, the same one the killed worker had sent.
    assert len(script.post_tool) == 2
    resent = [tool_results(r.body["messages"]) for r in script.post_tool]
    assert resent[0] == resent[1] == [bash_step.response["content"]]
    assert script.post_tool[1].received_at > killed_at - 1
    assert second.alive()

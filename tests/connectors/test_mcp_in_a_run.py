"""An MCP server's tools inside a durable run, with real workers (the production AgentInvoker)
and a real MCP server on loopback: the maker is offered and calls its read tool freely; its
destructive tool parks the run for approval and runs once approved; a worker SIGKILLed in the
middle of a write call leaves the call unsent by the worker that resumes the run (the model is
told its outcome is unknown), and the run still ends as the verifier says."""

from __future__ import annotations

import copy
import importlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from connectors.services import mcp_server_create
from harness.services import profile_create
from loops.models import ActionApproval, LoopRun, LoopStep, RunStatus
from loops.services.runs import run_trigger
from orchestrator.agents.services import employee_create, model_endpoint_create
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
from tests.support.chaos import log_tails
from tests.support.mcp_server import DocsServer
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
SEARCH, DELETE, SLOW = "mcp__docs__search", "mcp__docs__delete_page", "mcp__docs__slow_write"
WAIT = int(__import__("os").environ.get("LW_MCP_WAIT", "240"))


#: What the maker calls, in order, then it reports what it got.
CALLS = [(SEARCH, {"query": "agent"}), (DELETE, {"page": "install"}), (SLOW, {"seconds": 60})]
#: With the server down: searches until its breaker opens (5 failures), and once more.
SEARCHES = [(SEARCH, {"query": f"q{n}"}) for n in range(6)]


def script(request: RecordedRequest) -> Completion:
    """Leader plans; the maker makes the calls of the pattern's input ``calls`` (CALLS: it
    searches, deletes a page (parks), writes slowly (the worker is killed meanwhile)), then
    reports what it got; the verifier passes."""
    messages = request.body["messages"]
    role = role_of(messages)
    if role == "leader":
        return Completion(content=json.dumps(PLAN))
    if role == "verifier":
        return Completion(content=json.dumps(VERDICT))
    results = tool_results(messages)
    offered = {t["function"]["name"] for t in request.body.get("tools") or []}
    if not {SEARCH, DELETE, SLOW} <= offered:
        return Completion(content=f"Not offered the MCP tools, only {sorted(offered)}")
    calls = SEARCHES if "[calls searches]" in json.dumps(messages) else CALLS
    if len(results) < len(calls):
        name, arguments = calls[len(results)]
        return Completion(tool_calls=[(name, json.dumps(arguments))])
    return Completion(content="Done: " + " | ".join(results))


@pytest.fixture
def pattern(docs: DocsServer, tmp_path: Path) -> Iterator[Any]:
    with ModelServer() as model:
        model.always(script)
        endpoint = model_endpoint_create(
            name="mcp-loopback", provider="openai", base_url=model.url, model="mcp-script",
            max_retries=0, timeout_seconds=120,
        )  # fmt: skip
        seeds = importlib.import_module("harness.migrations.0002_seed_profiles").SEEDS
        settings = copy.deepcopy(seeds["default"]["settings"])
        settings["isolation"]["allowedConnectors"] = ["docs"]
        # The seeded profile restricts the network: the server on loopback must be listed.
        settings["isolation"]["allowedHosts"] = ["127.0.0.1"]
        profile_create(tag="with-docs", settings=settings, created_by="test")
        mcp_server_create(name="docs", url=docs.url)
        employee_create(username=LEADER, endpoint=endpoint, tools=["read", "list"])
        employee_create(
            username=MAKER, endpoint=endpoint, tools=[SEARCH, DELETE, SLOW], harness_tag="with-docs"
        )
        employee_create(username=VERIFIER, endpoint=endpoint, tools=["read"])
        # The slow write may run ungated at L2; the destructive delete still asks (high-risk).
        fields = with_autonomy("L2", git_repository(tmp_path / "repo"), [SLOW])
        # The role's profile and the employee's own both bound the maker: both allow docs.
        yield approval_pattern(
            "mcp-run", verifier_username=VERIFIER, maker_harness_tag="with-docs", **fields
        )
    model.check()


def _status(run: Any) -> str:
    return str(LoopRun.objects.get(pk=run.id).status)


def test_a_run_calls_mcp_tools_parks_on_the_destructive_one_and_survives_a_worker_kill(
    tmp_path: Path,
    workers: list[WorkerProcess],
    procs: list[Any],
    docs: DocsServer,
    pattern: Any,
    api_client_for: Callable[[str], APIClient],
) -> None:
    start_beat(procs, tmp_path, 1.0)  # the reaper: a dead worker's run is claimed again
    first = start_worker(workers, tmp_path, "first", **AGENT)
    run = run_trigger(pattern=pattern, actor="operator", inputs={"label": "mcp"})
    stops = (RunStatus.WAITING_APPROVAL, RunStatus.WAITING_HUMAN, RunStatus.FAILED)
    wait_for(lambda: _status(run) in stops, timeout=WAIT, interval=0.3, message=log_tails(workers))
    assert _status(run) == RunStatus.WAITING_APPROVAL, list(LoopStep.objects.filter(run=run))
    assert docs.names() == ["search"]  # the read ran without a human; the delete waits
    approval = ActionApproval.objects.get(run=run)
    assert approval.tool_name == DELETE
    decided = api_client_for("admin").post(
        f"/api/v1/approvals/{approval.id}/decide", {"decision": "approve"}, format="json"
    )
    assert decided.status_code == 200, decided.content

    assert docs.started_slow.wait(timeout=WAIT), log_tails(workers)
    [slow] = LoopStep.objects.filter(run=run, name=SLOW)
    assert slow.status == "started"
    first.kill()
    start_worker(workers, tmp_path, "second", **AGENT)
    wait_for(
        lambda: _status(run) in (RunStatus.WAITING_HUMAN, RunStatus.SUCCEEDED, RunStatus.FAILED),
        timeout=WAIT, interval=0.5, message=log_tails(workers),
    )  # fmt: skip
    final = LoopRun.objects.get(pk=run.id)
    assert (final.status, final.terminal_reason) == PASSED, (final.status, final.failure_reason)
    # Each call reached the server once: the interrupted write was not sent again.
    assert docs.names() == ["search", "delete_page"]
    steps = {s.name: s for s in LoopStep.objects.filter(run=run, kind="tool")}
    assert steps[SEARCH].response["content"] == "intro: Loopwright runs agent loops."
    assert steps[DELETE].response["content"] == "deleted install"
    slow = steps[SLOW]
    assert slow.status == "failed", (slow.status, slow.error, slow.response)
    assert "outcome is unknown" in slow.error, (slow.error, slow.response)


def test_a_server_that_is_down_gives_the_maker_tool_errors_not_a_failed_run(
    tmp_path: Path,
    workers: list[WorkerProcess],
    procs: list[Any],
    docs: DocsServer,
    pattern: Any,
) -> None:
    docs.stop()
    start_worker(workers, tmp_path, "only", **AGENT)
    run = run_trigger(pattern=pattern, actor="operator", inputs={"label": "[calls searches]"})
    ends = (RunStatus.WAITING_HUMAN, RunStatus.SUCCEEDED, RunStatus.FAILED)
    wait_for(lambda: _status(run) in ends, timeout=WAIT, interval=0.5, message=log_tails(workers))
    final = LoopRun.objects.get(pk=run.id)
    assert (final.status, final.terminal_reason) == PASSED, (final.status, final.failure_reason)
    answers = [s.error for s in LoopStep.objects.filter(run=run, kind="tool").order_by("seq")]
    assert len(answers) == 6, answers
    assert all("MCP server docs failed on search" in a for a in answers[:5]), answers
    assert "circuit is open" in answers[5], answers

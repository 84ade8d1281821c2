"""An A2A task is a real run: the official ``a2a-sdk`` client over real HTTP against the
production ASGI app starts it, the real engine drives it in this process (the production role
policy, the builtin file tools, a git worktree, a scripted model: ``tests.support.approvals``),
and the client follows it: ``working``, ``input-required`` while the maker's write waits for a
human's approval, then ``completed`` with the verifier's verdict and the diff it cited as
artifacts. ``CancelTask`` cancels the run (a blocking send then answers ``canceled``); the
A2A 0.3 method names work on the same URL."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import TaskNotCancelableError
from google.protobuf import json_format

from loops.models import LoopArtifact, LoopRun, RunStatus
from loops.services.approvals import approval_decide
from loops.services.runs import run_act
from orchestrator.accounts.roles import Role as LoopwrightRole
from orchestrator.accounts.services import user_ensure
from runtime.types import ChatRequest, ChatResponse, Usage
from tests.a2a_server.conftest import Collector, authorised, client_for, data_message, run_async
from tests.support.approvals import (
    Engine,
    RoleScript,
    approval_pattern,
    pending_approvals,
    role_of,
    write_call,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]
_CONTEXT = re.compile(r"Context from earlier steps of this run:\n```json\n(.*?)\n```", re.DOTALL)


class EvidenceScript(RoleScript):
    """The approvals script, but its verifier passes the check ``diff-reviewed`` citing the
    run's diff artifact (listed in the context the engine gives the verifier)."""

    async def complete(self, request: ChatRequest) -> ChatResponse:
        if role_of(request.messages) != "verifier":
            return await super().complete(request)
        self.requests.append(request)
        first = next(str(m.get("content")) for m in request.messages if m.get("role") == "user")
        found = _CONTEXT.search(first)
        artifacts = json.loads(found.group(1))["artifacts"] if found else []
        cited = [str(a["id"]) for a in artifacts if a["kind"] == "diff"]
        verdict = {
            "verdict": "pass",
            "reasons": ["the note was written as asked"],
            "checks": [{"name": "diff-reviewed", "passed": True, "evidence": cited}],
        }
        return ChatResponse(
            content=json.dumps(verdict),
            usage=Usage(prompt_tokens=10, completion_tokens=5),
            finish_reason="stop",
            model="a2a-evidence-script",
        )


def the_run(key: str, timeout: float = 30) -> LoopRun:
    deadline = time.monotonic() + timeout
    while True:
        run = LoopRun.objects.filter(pattern__key=key).first()
        if run is not None:
            return run
        assert time.monotonic() < deadline, "no run was started"
        time.sleep(0.02)


def states(events: list[Any]) -> list[str]:
    """The task states a follower saw, in order (a task, then status updates)."""
    found = []
    for event in events:
        if event.HasField("task"):
            found.append(TaskState.Name(event.task.status.state))
        elif event.HasField("status_update"):
            found.append(TaskState.Name(event.status_update.status.state))
    return found


def test_a_message_runs_through_an_approval_to_completed_with_the_verifiers_evidence(
    server: str, operator_token: str, repository: Path, tmp_path: Path
) -> None:
    approval_pattern(
        "note",
        repository_root=str(repository),
        base_ref="main",
        a2a_enabled=True,
        policy={"requiredChecks": ["diff-reviewed"]},
    )
    engine = Engine(tmp_path / "ledger", model=EvidenceScript())
    inputs = {"label": "a2a", "rounds": [[list(write_call("notes.txt", "tides are tidal\n"))]]}

    async def send(items: list[Any]) -> None:
        async with authorised(operator_token) as http:
            client = await client_for(server, "note", http)
            async for event in client.send_message(data_message(inputs)):
                items.append(event)

    sent = Collector(send)
    run = the_run("note")
    assert run.inputs == inputs
    assert engine.drive(run.id) == RunStatus.WAITING_APPROVAL
    first = sent.join()
    assert first[0].task.id == str(run.id)
    assert states(first)[0] == "TASK_STATE_WORKING"
    assert states(first)[-1] == "TASK_STATE_INPUT_REQUIRED"
    waiting = first[-1].status_update.status.message.parts[0].text
    assert waiting == "Waiting for a human to approve: write. Approvals are decided in Loopwright."

    async def get() -> Any:
        async with authorised(operator_token) as http:
            client = await client_for(server, "note", http)
            return await client.get_task(GetTaskRequest(id=str(run.id)))

    parked = run_async(get())
    assert parked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert json_format.MessageToDict(parked.metadata)["loopwright"]["status"] == "waiting_approval"

    approver = user_ensure(username="a2a-approver", roles=[LoopwrightRole.APPROVER])
    [approval] = pending_approvals(run)
    approval_decide(approval_id=approval.id, user=approver, decision="approve")

    async def subscribe(items: list[Any]) -> None:
        async with authorised(operator_token) as http:
            client = await client_for(server, "note", http)
            async for event in client.subscribe(SubscribeToTaskRequest(id=str(run.id))):
                items.append(event)

    followed = Collector(subscribe)
    followed.wait_for_items(1)
    assert engine.drive(run.id) == RunStatus.SUCCEEDED
    events = followed.join()
    assert states(events)[0] == "TASK_STATE_WORKING"
    assert states(events)[-1] == "TASK_STATE_COMPLETED"
    streamed = [e.artifact_update.artifact.name for e in events if e.HasField("artifact_update")]
    assert streamed == ["verdict", "changes.diff"]

    done = run_async(get())
    assert done.status.state == TaskState.TASK_STATE_COMPLETED
    verdict, evidence = done.artifacts
    checks = json_format.MessageToDict(verdict.parts[0].data)["checks"]
    diff = LoopArtifact.objects.get(run=run, kind="diff")
    assert checks == [{"name": "diff-reviewed", "passed": True, "evidence": [str(diff.id)]}]
    assert json_format.MessageToDict(verdict.parts[0].data)["effective_verdict"] == "pass"
    assert evidence.artifact_id == str(diff.id)
    assert evidence.parts[0].media_type == "text/x-diff"
    assert "+tides are tidal" in evidence.parts[0].text
    assert json_format.MessageToDict(evidence.metadata) == {
        "kind": "diff",
        "checks": ["diff-reviewed"],
    }


def test_cancel_cancels_the_run_and_the_blocking_send_answers_canceled(
    server: str, operator_token: str
) -> None:
    approval_pattern("slow", a2a_enabled=True)

    async def send_and_wait(items: list[Any]) -> None:
        async with authorised(operator_token) as http:
            client = await client_for(server, "slow", http, streaming=False)
            async for event in client.send_message(data_message({"label": "wait"})):
                items.append(event)

    blocked = Collector(send_and_wait)
    run = the_run("slow")
    time.sleep(0.3)
    assert blocked.items == []  # still waiting: nothing drives the run

    async def cancel() -> Any:
        async with authorised(operator_token) as http:
            client = await client_for(server, "slow", http)
            return await client.cancel_task(CancelTaskRequest(id=str(run.id)))

    canceled = run_async(cancel())
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED
    assert "Canceled by a2a-operator" in canceled.status.message.parts[0].text
    stored = LoopRun.objects.get(pk=run.id)
    assert (stored.status, stored.terminal_reason) == (RunStatus.CANCELED, "canceled")
    [answer] = blocked.join()
    assert answer.task.status.state == TaskState.TASK_STATE_CANCELED
    with pytest.raises(TaskNotCancelableError, match="canceled"):
        run_async(cancel())

    # The A2A 0.3 method names, on the same URL, without the version header.
    body = {"jsonrpc": "2.0", "id": 7, "method": "tasks/get", "params": {"id": str(run.id)}}
    old = httpx.post(
        f"{server}/a2a/slow", json=body, headers={"Authorization": f"Bearer {operator_token}"}
    )
    assert old.status_code == 200
    assert old.json()["result"]["status"]["state"] == "canceled"
    body["params"] = {"id": str(uuid.uuid4())}
    missing = httpx.post(
        f"{server}/a2a/slow", json=body, headers={"Authorization": f"Bearer {operator_token}"}
    )
    assert missing.json()["error"]["code"] == -32001


def test_a_stream_sends_heartbeats_while_working_and_ends_when_canceled(
    server: str, operator_token: str, settings: Any
) -> None:
    settings.LOOPWRIGHT_A2A = {"POLL_SECONDS": 0.05, "WAIT_SECONDS": 60.0, "HEARTBEAT_SECONDS": 0.2}
    approval_pattern("idle", a2a_enabled=True)

    async def stream(items: list[Any]) -> None:
        async with authorised(operator_token, timeout=1.0) as http:
            client = await client_for(server, "idle", http)
            async for event in client.send_message(data_message({"label": "idle"})):
                items.append(event)

    followed = Collector(stream)
    followed.wait_for_items(4)  # the task, then heartbeats: nothing drives the run
    run = the_run("idle")
    assert states(followed.items)[:4] == ["TASK_STATE_WORKING"] * 4
    stamps = [e.status_update.status.timestamp.ToDatetime() for e in followed.items[1:4]]
    assert stamps == sorted(stamps)
    time.sleep(1.5)  # longer than the client's read timeout: the heartbeats keep it open
    run_act(run_id=run.id, action="cancel", actor="someone")
    events = followed.join()
    assert states(events)[-1] == "TASK_STATE_CANCELED"
    assert "Canceled by someone" in events[-1].status_update.status.message.parts[0].text


def test_a_blocking_send_gives_up_after_the_wait_with_the_task_as_it_is(
    server: str, operator_token: str, settings: Any
) -> None:
    settings.LOOPWRIGHT_A2A = {"POLL_SECONDS": 0.05, "WAIT_SECONDS": 0.5, "HEARTBEAT_SECONDS": 4}
    approval_pattern("late", a2a_enabled=True)

    async def send() -> list[Any]:
        async with authorised(operator_token) as http:
            client = await client_for(server, "late", http, streaming=False)
            return [event async for event in client.send_message(data_message({"label": "x"}))]

    started = time.monotonic()
    [answer] = run_async(send())
    assert 0.5 <= time.monotonic() - started < 10
    assert answer.task.status.state == TaskState.TASK_STATE_WORKING
    assert LoopRun.objects.get(pk=answer.task.id).status == RunStatus.QUEUED

"""Streaming, wired through a real run: an employee set to stream (``PATCH
/api/v1/employees/<name>``) makes streamed requests, a stream that sends a preamble and splits
tool-call arguments across chunks completes the run, and what the run persists is the same as
when it does not stream.

The run is triggered as the API does and driven in this process by the production ``drive_run``
with the production ``AgentInvoker`` (the employee's rows, the harness policy, the builtin
tools, the OpenAI-compatible client) against the loopback model server; only the driver's thread
pool is replaced by inline calls, so the writes land in the test's transaction.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest
from django.db import DEFAULT_DB_ALIAS, connections
from rest_framework.test import APIClient

from loops import live_text
from loops.models import LoopRun, LoopStep, RunStatus
from loops.services.claims import run_claim
from loops.services.runs import run_trigger
from loops.worker.engine import drive_run
from loops.worker.invoker import AgentInvoker
from tests.support.approvals import (
    LEADER,
    MAKER,
    VERIFIER,
    approval_pattern,
    loopback_team,
    role_of,
    script_turn,
)
from tests.support.model_server import (
    Completion,
    ModelServer,
    Pause,
    RecordedRequest,
    Stream,
    Text,
    ToolCallArgs,
    as_requested,
    streamed,
)

pytestmark = pytest.mark.django_db
TEAM = (LEADER, MAKER, VERIFIER)
PREAMBLE = "Let me read the notes before I report on them."
REASONING = "The notes come first; then the report."


def reply(request: RecordedRequest) -> Completion:
    """The approvals script (leader plans, maker does ``inputs["rounds"]``, verifier passes),
    with reasoning on every answer and a preamble before every tool call."""
    turn = script_turn(request.body["messages"])
    made = sum(1 for m in request.body["messages"] if m.get("role") == "assistant")
    calls = [(name, json.dumps(args)) for name, args in turn.calls]
    return Completion(
        content=PREAMBLE if calls else turn.content,
        tool_calls=[
            {"id": f"call_{made}_{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)
        ],
        reasoning=REASONING,
        model="stream-script",
    )


@pytest.fixture
def model() -> Iterator[ModelServer]:
    with ModelServer() as server:
        server.always(as_requested(reply))
        yield server
    server.check()


@pytest.fixture
def operator(api_client_for: Callable[[str], APIClient]) -> APIClient:
    return api_client_for("operator")


def set_streaming(client: APIClient, on: bool, check: str = "auto") -> None:
    """From outside, as an operator does."""
    for username in TEAM:
        body = {"streaming": on, "stream_tool_call_check": check}
        response = client.patch(f"/api/v1/employees/{username}", body, format="json")
        assert response.status_code == 200, response.content
        assert response.json()["streaming"] is on


class _Driver:
    """What ``drive_run`` needs of a RunDriver, database calls inline."""

    def __init__(self, invoker: AgentInvoker) -> None:
        self.invoker = invoker

    async def db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)


def drive(run_id: uuid.UUID) -> str:
    """Claim the run and drive it with the production invoker until it finishes or parks."""
    [claim] = run_claim(owner="stream-test", lease_seconds=300, run_id=run_id)
    invoker = AgentInvoker()
    outer = connections[DEFAULT_DB_ALIAS]

    async def main() -> None:
        connections[DEFAULT_DB_ALIAS] = outer
        await drive_run(_Driver(invoker), claim)  # type: ignore[arg-type]

    with mock.patch.dict(os.environ, {"DJANGO_ALLOW_ASYNC_UNSAFE": "true"}):
        asyncio.run(main())
    return str(LoopRun.objects.get(pk=run_id).status)


def run_once(key: str) -> LoopRun:
    pattern = approval_pattern(key)
    inputs = {"label": key, "rounds": [[["read", {"path": "notes.txt"}]]]}
    run = run_trigger(pattern=pattern, actor="test", inputs=inputs)
    status = drive(run.id)
    assert status == RunStatus.SUCCEEDED, (status, LoopRun.objects.get(pk=run.id).failure_reason)
    return LoopRun.objects.get(pk=run.id)


def persisted(run: LoopRun) -> list[dict[str, Any]]:
    """Every step as persisted, timings and the run's own identity left out."""
    rows = []
    for step in LoopStep.objects.filter(run=run).order_by("seq"):
        row = {
            "seq": step.seq,
            "role": step.role,
            "invocation": step.invocation,
            "kind": step.kind,
            "status": step.status,
            "name": step.name,
            "request": step.request,
            "response": step.response,
            "error": step.error,
            "tokens_in": step.tokens_in,
            "tokens_out": step.tokens_out,
            "cost": step.cost,
        }
        text = json.dumps(row, default=str).replace(str(run.id), "<run>")
        rows.append(json.loads(text.replace(str(run.pattern.key), "<key>")))
    return rows


def test_an_employee_set_to_stream_makes_streamed_requests_and_finishes_the_run(
    model: ModelServer, operator: APIClient
) -> None:
    loopback_team(model.url, "stream")
    set_streaming(operator, True)
    run = run_once("stream-on")
    bodies = model.bodies
    assert len(bodies) == 4  # leader, maker (the tool call, the answer), verifier
    assert all(body["stream"] is True for body in bodies)
    assert all(body["stream_options"] == {"include_usage": True} for body in bodies)
    # The maker's first step came as a preamble and a tool call whose arguments were split in
    # three chunks; it is persisted whole, and the call ran.
    maker = LoopStep.objects.filter(run=run, invocation="maker:0").order_by("seq")
    first = maker.filter(kind="model").first()
    assert first is not None
    message = first.response["message"]
    assert message["content"] == PREAMBLE
    assert message["tool_calls"][0]["function"] == {
        "name": "read",
        "arguments": json.dumps({"path": "notes.txt"}),
    }
    assert first.response["reasoning_content"] == REASONING
    assert first.response["model"] == "stream-script"
    [read] = maker.filter(kind="tool")
    assert read.name == "read" and read.request["arguments"] == {"path": "notes.txt"}
    # What the server sent for that step: the preamble, then the arguments in three chunks.
    events = streamed(reply(model.requests[1])).events
    assert "".join(e.text for e in events if isinstance(e, Text)) == PREAMBLE
    assert len([e for e in events if isinstance(e, ToolCallArgs)]) == 3


@pytest.mark.parametrize("check", ["auto", "firstContent", "drain"])
def test_a_streamed_run_persists_exactly_what_the_same_run_persists_unstreamed(
    model: ModelServer, operator: APIClient, check: str
) -> None:
    loopback_team(model.url, "same")
    set_streaming(operator, False)
    # Keys of the same length: the goal carries the key, and the step records its token estimate.
    plain = persisted(run_once("same-a"))
    plain_bodies = list(model.bodies)
    set_streaming(operator, True, check)
    model.requests.clear()
    streamed_run = persisted(run_once("same-b"))
    assert len(streamed_run) == len(plain)
    for got, want in zip(streamed_run, plain, strict=True):
        assert {k: v for k, v in got.items() if v != want[k]} == {}, want
    assert [b.get("stream") for b in plain_bodies] == [None] * len(plain_bodies)
    assert all(b["stream"] is True for b in model.bodies)
    # Apart from asking for a stream, the requests were the same too; in firstContent the
    # preamble was released as text before the tool call came, so that round was sent again
    # (the client's self-healing upgrade to drain).
    strip = ("stream", "stream_options")
    as_sent = [
        json.dumps({k: v for k, v in b.items() if k not in strip}).replace("same-b", "<key>")
        for b in model.bodies
    ]
    if check == "firstContent":
        assert as_sent[1] == as_sent[2]
        del as_sent[2]
    assert as_sent == [json.dumps(b).replace("same-a", "<key>") for b in plain_bodies]


def test_the_live_text_of_a_slow_answer_is_readable_while_it_streams(
    model: ModelServer, operator: APIClient
) -> None:
    """The maker's answer pauses mid-stream; meanwhile the run's live text holds what came."""
    loopback_team(model.url, "live")
    set_streaming(operator, True)

    def slow(request: RecordedRequest) -> Completion | Stream:
        answer = reply(request)
        if role_of(request.body["messages"]) != "maker" or answer.tool_calls:
            return streamed(answer)
        text = answer.content or ""
        return Stream([Text(text[:9]), Pause(1.5), Text(text[9:])], model=answer.model)

    model.always(slow)
    pattern = approval_pattern("live-text")
    inputs = {"label": "live", "rounds": [[["read", {"path": "notes.txt"}]]]}
    run = run_trigger(pattern=pattern, actor="test", inputs=inputs)
    seen: list[tuple[str, str]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.02):
            seen.extend((e.invocation, e.text) for e in live_text.read(run.id))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        assert drive(run.id) == RunStatus.SUCCEEDED
    finally:
        stop.set()
        watcher.join()
    # Held for the auto-detection window (tools were offered), then released while the model
    # was still silent; the tool-call step's preamble was never shown.
    assert ("maker:0", "Finished.") in seen
    assert all(text != PREAMBLE for _, text in seen)
    assert live_text.read(run.id) == []
    answer = LoopStep.objects.filter(run=run, invocation="maker:0", kind="model").last()
    assert answer is not None and answer.response["message"]["content"].startswith("Finished.")

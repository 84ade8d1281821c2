"""External A2A agents as agent tools, against a real ``a2a-sdk`` agent on loopback: offered as
``a2a__<agent>`` with the admin's trust tier and planned by the harness; a call answers with the
task's artifacts, streaming or polling; failures and timeouts are tool errors; a task that asks
for input makes the call ask a person, and the answer goes to the same task, once;
a re-issued call follows the same remote task without sending again; a cancelled run cancels
the remote task."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from connectors.a2a_services import a2a_agent_create
from connectors.a2a_tools import A2A_TOOLS
from connectors.models import A2ACall
from harness.planner import connector_of, plan_tools
from loops.models import LoopArtifact
from loops.services.runs import run_trigger
from runtime import run_cancellation
from runtime.breaker import FAILURE_THRESHOLD
from runtime.policy import Decision
from runtime.tools.base import Invocation, ToolContext, ToolResult
from runtime.types import Effect
from tests.support.a2a_agent import AgentLog, a2a_agent
from tests.support.approvals import approval_pattern

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
RUN = uuid.uuid4()
ALLOW = {"isolation": {"networkAccess": "allow"}}


def _context(
    key: str, *, seconds: float = 30, answer: str = "", harness: dict[str, Any] | None = ALLOW
) -> ToolContext:
    invocation = Invocation(run_id=RUN, role="maker", name="maker:0", employee="e", harness=harness)
    return ToolContext(
        workdir=None,
        idempotency_key=key,
        deadline=time.monotonic() + seconds,
        invocation=invocation,
        answer=answer,
    )


async def _run(
    name: str, arguments: dict[str, Any], key: str, seconds: float = 30, answer: str = ""
) -> ToolResult:
    tool = A2A_TOOLS.get(name)
    assert tool is not None, name
    return await tool.run(arguments, _context(key, seconds=seconds, answer=answer))


def _call(
    name: str, arguments: dict[str, Any], key: str = "run:1:0", answer: str = ""
) -> ToolResult:
    return asyncio.run(_run(name, arguments, key, answer=answer))


def _task_known(key: str) -> bool:
    try:
        return A2ACall.objects.filter(idempotency_key=key).exclude(task_id="").exists()
    finally:
        connection.close()  # this executor thread's own connection


async def _interrupted(name: str, text: str, key: str) -> None:
    """Start a call and cancel it (as a lost lease does) once its remote task is known."""
    task = asyncio.create_task(_run(name, {"message": text}, key))
    for _ in range(200):
        await asyncio.sleep(0.05)
        if await asyncio.to_thread(_task_known, key):
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.fixture
def canceled_runs() -> Iterator[set[uuid.UUID]]:
    """The runs the engine's probe reports as cancelled (the ids a test puts in the set)."""
    canceled: set[uuid.UUID] = set()
    before = run_cancellation._probe
    run_cancellation.run_canceled_probe_register(lambda run_id: run_id in canceled)
    yield canceled
    run_cancellation._probe = before


def test_the_agent_is_offered_with_its_tier_and_planned_as_a_connector(
    helper_agent: tuple[str, AgentLog],
) -> None:
    a2a_agent_create(name="helper", card_url=helper_agent[0], effect="read")
    (spec,) = [s for s in A2A_TOOLS.specs() if s.name == "a2a__helper"]
    assert spec.effect is Effect.READ and spec.parameters["required"] == ["message"]
    assert "Answers, asks for input" in spec.description
    assert connector_of("a2a__helper") == "helper"
    assert connector_of("a2a__") is None and connector_of("a2a__x__y") is None
    tools = {"allow": ["*"], "ask": [], "deny": [], "effects": {}, "trustedPreHandlerTools": []}
    allowed = plan_tools({"tools": tools, "isolation": {"allowedConnectors": ["helper"]}}, [spec])
    assert allowed.decision("a2a__helper") is Decision.ALLOW
    closed = plan_tools({"tools": tools, "isolation": {"allowedConnectors": ["docs"]}}, [spec])
    assert closed.decision("a2a__helper") is Decision.DENY
    assert "isolation.allowedConnectors" in closed.by_name["a2a__helper"].reason


@pytest.mark.parametrize("fixture", ["helper_agent", "polled_agent"])
def test_answers_and_streams_come_back_as_the_result(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    url, log = request.getfixturevalue(fixture)
    a2a_agent_create(name="helper", card_url=url)
    answer = _call("a2a__helper", {"message": "answer", "data": {"q": 1}}, "run:1:0")
    assert answer == ToolResult('the answer is 42\n{"answer": 42}')
    streamed = _call("a2a__helper", {"message": "stream"}, "run:2:0")
    assert streamed == ToolResult("stream done")
    assert log.texts() == ["answer", "stream"] and log.data == [{"q": 1}]
    row = A2ACall.objects.get(idempotency_key="run:2:0")
    assert row.state == "completed" and row.task_id in log.ended and row.context_id


def test_failures_are_tool_errors(helper_agent: tuple[str, AgentLog]) -> None:
    a2a_agent_create(name="helper", card_url=helper_agent[0])
    failed = _call("a2a__helper", {"message": "explode"}, "run:1:0")
    assert failed.is_error and "ended failed: cannot do 'explode'" in failed.content
    bad = _call("a2a__helper", {"message": ""}, "run:3:0")
    assert bad.is_error and "message must be" in bad.content


@pytest.mark.parametrize("fixture", ["helper_agent", "polled_agent"])
def test_a_question_is_asked_and_its_answer_goes_to_the_same_task_once(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    url, log = request.getfixturevalue(fixture)
    a2a_agent_create(name="helper", card_url=url)
    asked = _call("a2a__helper", {"message": "ask"}, "run:2:0")
    assert not asked.is_error and asked.input_request == "A2A agent helper asks: Which colour?"
    row = A2ACall.objects.get(idempotency_key="run:2:0")
    assert row.state == "input-required" and row.answered_key == ""
    # The call runs again under its approval's key, with the answer: the same task goes on.
    answered = _call("a2a__helper", {"message": "ask"}, "run:2:0:approval:a1", answer="blue")
    assert answered == ToolResult("you said: blue")
    row.refresh_from_db()
    assert row.state == "completed" and row.answered_key == "run:2:0:approval:a1"
    assert log.messages == [("ask", row.task_id), ("blue", row.task_id)]
    # A re-issue of the answered call (a crash after it was sent) never sends it again.
    again = _call("a2a__helper", {"message": "ask"}, "run:2:0:approval:a1", answer="blue")
    assert again == ToolResult("you said: blue")
    assert len(log.messages) == 2


@pytest.mark.parametrize("fixture", ["helper_agent", "polled_agent"])
def test_a_reissued_call_follows_the_same_task_without_sending_again(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    url, log = request.getfixturevalue(fixture)
    a2a_agent_create(name="helper", card_url=url)
    asyncio.run(_interrupted("a2a__helper", "slow 1.5", "run:1:0"))
    row = A2ACall.objects.get(idempotency_key="run:1:0")
    assert row.task_id and row.state in ("submitted", "working")
    assert log.ended == {}  # a lost lease is not a cancelled run: the task goes on
    again = _call("a2a__helper", {"message": "slow 1.5"}, "run:1:0")
    assert again == ToolResult("slow done")
    assert log.texts() == ["slow 1.5"]  # one message, one task
    assert log.ended == {row.task_id: "completed"}


def test_a_message_sent_without_a_known_task_is_not_sent_again(
    helper_agent: tuple[str, AgentLog],
) -> None:
    agent = a2a_agent_create(name="helper", card_url=helper_agent[0])
    A2ACall.objects.create(idempotency_key="run:1:0", agent=agent, sent_at=timezone.now())
    again = _call("a2a__helper", {"message": "answer"}, "run:1:0")
    assert again.is_error and "not sent again" in again.content
    assert helper_agent[1].texts() == []


def test_cancelling_the_run_cancels_the_remote_task(
    helper_agent: tuple[str, AgentLog], canceled_runs: set[uuid.UUID]
) -> None:
    a2a_agent_create(name="helper", card_url=helper_agent[0])
    canceled_runs.add(RUN)
    asyncio.run(_interrupted("a2a__helper", "slow 20", "run:1:0"))
    row = A2ACall.objects.get(idempotency_key="run:1:0")
    assert helper_agent[1].ended == {row.task_id: "canceled"}
    assert row.state == "canceled"


def test_a_call_that_runs_out_of_time_cancels_its_task(helper_agent: tuple[str, AgentLog]) -> None:
    a2a_agent_create(name="helper", card_url=helper_agent[0], timeout_seconds=1)
    late = _call("a2a__helper", {"message": "slow 20"}, "run:1:0")
    assert late.is_error and "did not finish within 1 s" in late.content
    assert list(helper_agent[1].ended.values()) == ["canceled"]


def test_an_agent_that_is_down_gives_tool_errors_and_opens_its_breaker() -> None:
    with a2a_agent() as (url, _):
        a2a_agent_create(name="gone", card_url=url)
    for index in range(FAILURE_THRESHOLD):
        failed = _call("a2a__gone", {"message": "answer"}, f"run:{index}:0")
        assert failed.is_error and "A2A agent gone failed" in failed.content
    refused = _call("a2a__gone", {"message": "answer"}, "run:9:0")
    assert refused.is_error and "circuit is open" in refused.content


def test_headers_are_sent_only_to_the_cards_own_host(
    helper_agent: tuple[str, AgentLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, log = helper_agent
    monkeypatch.setenv("LOOPWRIGHT_SECRET_AGENT", "sekrit")
    # The card is read from localhost, but names 127.0.0.1 as its interface.
    elsewhere = url.replace("127.0.0.1", "localhost")
    a2a_agent_create(
        name="helper", card_url=elsewhere, headers={"X-Key": "LOOPWRIGHT_SECRET_AGENT"}
    )
    refused = _call("a2a__helper", {"message": "answer"})
    assert refused.is_error and "not on the card's host" in refused.content
    assert log.texts() == []
    a2a_agent_create(name="polled", card_url=elsewhere)  # no headers: nothing to leak
    A2A_TOOLS.invalidate()
    assert not _call("a2a__polled", {"message": "answer"}, "run:2:0").is_error


@pytest.mark.usefixtures("seeded_profiles")
def test_files_come_back_as_artifacts_of_the_run(helper_agent: tuple[str, AgentLog]) -> None:
    a2a_agent_create(name="helper", card_url=helper_agent[0])
    run = run_trigger(pattern=approval_pattern("a2a-files"), actor="test", inputs={"label": "f"})
    key = f"{run.id}:4:0"
    invocation = Invocation(
        run_id=run.id, role="maker", name="maker:0", employee="e", harness=ALLOW
    )
    context = replace(_context(key), invocation=invocation)
    tool = A2A_TOOLS.get("a2a__helper")
    assert tool is not None
    result = asyncio.run(tool.run({"message": "file"}, context))
    [csv, link] = LoopArtifact.objects.filter(run=run, kind="tool-file").order_by("created_at")
    assert (csv.name, csv.content_type, csv.content) == (
        "report.csv",
        "text/csv",
        "colour,count\nblue,3\n",
    )
    assert (link.name, link.content, link.metadata["url"]) == (
        "big.bin",
        "",
        "https://files.example/big.bin",
    )
    assert result.content.splitlines()[-2:] == [
        f"[file report.csv: kept as run artifact {csv.id}]",
        f"[file big.bin: kept as run artifact {link.id}]",
    ]
    assert "see the files" in result.content
    # A re-issue (a crash after the task ended) keeps each file once.
    again = asyncio.run(tool.run({"message": "file"}, context))
    assert again.content == result.content
    assert LoopArtifact.objects.filter(run=run).count() == 2


def test_a_call_reaches_only_an_agent_the_roles_network_reaches(
    helper_agent: tuple[str, AgentLog],
) -> None:
    a2a_agent_create(name="helper", card_url=helper_agent[0])
    tool = A2A_TOOLS.get("a2a__helper")
    assert tool is not None
    for harness, why in (
        (None, "isolation.networkAccess is deny"),
        ({"isolation": {"networkAccess": "deny"}}, "isolation.networkAccess is deny"),
        (
            {"isolation": {"networkAccess": "restricted", "allowedHosts": ["*.example.com"]}},
            "'127.0.0.1' is not in its isolation.allowedHosts",
        ),
    ):
        refused = asyncio.run(tool.run({"message": "answer"}, _context("run:9:0", harness=harness)))
        assert refused.is_error and why in refused.content, refused.content
    assert helper_agent[1].messages == []  # nothing reached the agent
    listed = {"isolation": {"networkAccess": "restricted", "allowedHosts": ["127.0.0.1"]}}
    answer = asyncio.run(tool.run({"message": "answer"}, _context("run:9:0", harness=listed)))
    assert not answer.is_error

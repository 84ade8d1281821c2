"""An employee's preset messages, a run's images, ``keepThink`` and ``streamRetryMode``, end to
end: the employee rows (written through the API or the services) are read by the production
wiring (``ProfileCache`` → ``employee_tool_loop``), one invocation runs against the loopback
model server, and the tests read what the endpoint received (``server.bodies``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from orchestrator.agents import clients
from orchestrator.agents.models import Employee
from orchestrator.agents.services import employee_create, employee_update, model_endpoint_create
from orchestrator.agents.wiring import ProfileCache, employee_tool_loop
from runtime import prompt_context
from runtime.chat import ChatTurn, chat_complete
from runtime.invocation import InvocationOutcome, InvocationRequest, LoopRole, OutcomeKind
from runtime.loop import ToolLoopInvoker
from runtime.model_config import ModelParams
from runtime.policy import ToolPolicy
from runtime.tools import ToolRegistry
from tests.support.factories import make_pattern
from tests.support.journal import MemoryJournal
from tests.support.model_server import Completion, ModelServer, Stream, Text

pytestmark = pytest.mark.django_db
HARNESS: dict[str, Any] = {"settings": {}, "provenance": {}}
PNG = "data:image/png;base64,iVBORw0KGgo="
PRESETS = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
]


@pytest.fixture(autouse=True)
def no_breaker(monkeypatch: pytest.MonkeyPatch) -> None:
    # The invocations run on this thread's event loop: keep the breaker's store off the database.
    monkeypatch.setattr(clients, "breaker_default", lambda: None)


def make_employee(
    server: ModelServer, username: str, *, vision: bool = False, **fields: Any
) -> Employee:
    endpoint = model_endpoint_create(
        name=f"{username}-loopback", provider="openai", base_url=server.url, model="m",
        max_retries=fields.pop("max_retries", 0), timeout_seconds=30, vision=vision,
    )  # fmt: skip
    return employee_create(
        username=username, endpoint=endpoint, system_prompt=f"You are {username}.", **fields
    )


def tool_loop(username: str) -> ToolLoopInvoker:
    """The employee's loop as the worker and the gateway build it (no tools: no plan needed)."""
    no_tools = ToolPolicy.from_decisions({})
    profile = ProfileCache().get(username)
    route = profile.route(role="maker")
    return employee_tool_loop(
        profile, ToolRegistry([]), route=route, policy=lambda _request: no_tools
    )


def invoke(employee: Employee, **fields: Any) -> tuple[InvocationOutcome, MemoryJournal]:
    """One maker invocation of ``employee`` through the production wiring."""
    loop = tool_loop(employee.username)
    request = InvocationRequest(
        run_id=uuid.uuid4(), role=LoopRole.MAKER, invocation="maker:0",
        employee_username=employee.username, goal="Describe it.", harness=HARNESS,
        prompt_blocks=(), **fields,
    )  # fmt: skip
    journal = MemoryJournal()
    return asyncio.run(loop.invoke(request, journal)), journal


def test_preset_messages_are_validated_and_sent_after_the_system_prompt(
    model_server: ModelServer, api_client_for: Callable[[str], APIClient]
) -> None:
    ada = make_employee(model_server, "ada")
    operator = api_client_for("operator")
    bad = [PRESETS[0], {"role": "robot", "content": "4"}]
    refused = operator.patch("/api/v1/employees/ada", {"preset_messages": bad}, format="json")
    assert refused.status_code == 400, refused.content
    assert [e["pointer"] for e in refused.json()["errors"]] == ["/preset_messages/1/role"]
    saved = operator.patch("/api/v1/employees/ada", {"preset_messages": PRESETS}, format="json")
    assert saved.status_code == 200 and saved.json()["preset_messages"] == PRESETS
    model_server.queue(Completion(content="Done."), Completion(content="Hi."))

    # A run's invocation: system prompt, presets, goal; the first step records them all.
    outcome, journal = invoke(ada)
    assert outcome.kind == OutcomeKind.COMPLETED, outcome
    system, *presets, goal = model_server.bodies[0]["messages"]
    assert (system["role"], presets, goal["role"]) == ("system", PRESETS, "user")
    assert goal["content"].startswith("Goal:\nDescribe it.")
    assert journal.of_kind("model")[0].request["prompt"] == model_server.bodies[0]["messages"]

    # A chat: after the client's leading system messages, before the rest of its conversation.
    chat = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"})
    loop = tool_loop("ada")
    asyncio.run(chat_complete(loop, employee="ada", harness=HARNESS, turn=ChatTurn(chat)))
    system, *rest = model_server.bodies[1]["messages"]
    assert rest == [chat[0], *PRESETS, chat[1]]


def test_run_images_are_checked_at_the_trigger_and_sent_as_parts_to_a_vision_endpoint(
    model_server: ModelServer, api_client_for: Callable[[str], APIClient]
) -> None:
    pattern = make_pattern()
    refused = api_client_for("operator").post(
        f"/api/v1/patterns/{pattern.key}/trigger",
        {"inputs": {"images": ["ftp://example.com/a.png"]}},
        format="json",
    )
    assert refused.status_code == 400, refused.content
    assert [e["pointer"] for e in refused.json()["errors"]] == ["/inputs/images/0"]

    seer = make_employee(model_server, "seer", vision=True)
    model_server.queue(Completion(content="A square."))
    images = [PNG, "https://example.com/b.png"]
    outcome, _ = invoke(seer, inputs={"path": "a.txt", "images": images})
    assert outcome.kind == OutcomeKind.COMPLETED, outcome
    text, *parts = model_server.bodies[0]["messages"][-1]["content"]
    assert parts == [{"type": "image_url", "image_url": {"url": url}} for url in images]
    assert text["type"] == "text" and '"path": "a.txt"' in text["text"]
    assert "images" not in text["text"] and PNG not in text["text"]

    # An endpoint without vision: the invocation fails before any model call, naming it.
    blind = make_employee(model_server, "blind")
    outcome, _ = invoke(blind, inputs={"images": [PNG]})
    assert (outcome.kind, outcome.code) == (OutcomeKind.FAILED, "images_unsupported")
    assert "'blind-loopback'" in outcome.reason
    assert len(model_server.bodies) == 1


def test_keep_think_decides_whether_reasoning_stays_in_the_answer(
    model_server: ModelServer,
) -> None:
    plain = make_employee(model_server, "plain")
    model_server.queue(Completion(content="<think>Let me add.</think>\n4"))
    outcome, journal = invoke(plain)
    assert outcome.output == {"text": "4"}, outcome
    assert journal.of_kind("model")[0].response["reasoning_content"] == "Let me add."

    keeper = make_employee(model_server, "keeper", params=ModelParams(keepThink=True))
    model_server.queue(Completion(content="4", reasoning="Let me add."))
    outcome, _ = invoke(keeper)
    assert outcome.output == {"text": "<think>Let me add.</think>4"}, outcome
    assert all("keepThink" not in str(body) for body in model_server.bodies)  # never sent


def test_stream_retry_mode_full_retries_a_stream_broken_midway(
    model_server: ModelServer,
) -> None:
    streamer = make_employee(
        model_server, "streamer", streaming=True, stream_retry_mode="full", max_retries=1
    )
    broken = Stream([Text("Hel")], complete=False)
    model_server.queue(broken, Stream([Text("Hello.")]))
    outcome, _ = invoke(streamer)
    assert outcome.output == {"text": "Hello."}, outcome
    assert len(model_server.bodies) == 2 and model_server.bodies[1]["stream"] is True

    # off (the default): text went out live, so the broken stream is not sent again.
    employee_update(employee=streamer, stream_retry_mode="off")
    model_server.queue(broken)
    with pytest.raises(Exception, match="stream broke after output was delivered"):
        invoke(streamer)
    assert len(model_server.bodies) == 3


class ToolsSeen:
    """A prompt provider that records the employee tools each request came with."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, ...] | None] = []

    async def prompt_block(self, request: InvocationRequest) -> str:
        return self.prompt_block_here(request)

    def prompt_block_here(self, request: InvocationRequest) -> str:
        self.seen.append(request.employee_tools)
        return ""


def test_the_prompt_providers_get_the_tools_of_the_profile_the_invocation_read(
    model_server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    ada = make_employee(model_server, "ada", tools=["skill", "read"])
    seen = ToolsSeen()
    monkeypatch.setattr(prompt_context, "_PROVIDERS", [seen])
    model_server.queue(Completion(content="Done."))
    loop = tool_loop(ada.username)
    request = InvocationRequest(
        run_id=uuid.uuid4(), role=LoopRole.MAKER, invocation="maker:0",
        employee_username=ada.username, goal="Describe it.", harness=HARNESS,
    )  # fmt: skip
    outcome = asyncio.run(loop.invoke(request, MemoryJournal()))
    assert outcome.kind == OutcomeKind.COMPLETED, outcome
    assert seen.seen == [("skill", "read")]

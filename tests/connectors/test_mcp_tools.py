"""MCP servers' tools as agent tools, against a real MCP server on loopback: offered as
``mcp__<server>__<tool>`` with their effect tier, planned by the harness (the server must be in
``isolation.allowedConnectors``), called over a session of their own; failures are tool errors
and open the server's breaker; a re-issued call is sent again only when that is safe."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from connectors.services import mcp_server_create
from connectors.tools import IDEMPOTENCY_META, MCP_TOOLS
from harness.planner import plan_tools
from runtime.breaker import FAILURE_THRESHOLD
from runtime.invocation import OutcomeKind
from runtime.loop import ToolLoopInvoker
from runtime.policy import Decision, ToolPolicy
from runtime.tools import ToolRegistry
from runtime.tools.base import ToolContext, ToolResult
from runtime.tools.bash import network_access
from runtime.types import Effect
from tests.runtime.chat_helpers import model_client
from tests.support.fake_model import make_request
from tests.support.journal import MemoryJournal
from tests.support.mcp_server import CHART_PNG, DocsServer
from tests.support.model_server import Completion, ModelServer, make_model_server, model_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
__all__ = ["make_model_server", "model_server"]  # the loopback model server's fixtures


ALLOW = {"isolation": {"networkAccess": "allow"}}


def _call(
    name: str,
    arguments: dict[str, Any],
    *,
    reissued: bool = False,
    harness: dict[str, Any] | None = ALLOW,
) -> ToolResult:
    tool = MCP_TOOLS.get(name)
    assert tool is not None, name
    context = ToolContext(
        workdir=None,
        idempotency_key=f"run:3:{name}",
        deadline=time.monotonic() + 30,
        reissued=reissued,
    )
    with network_access(harness):  # what the invoker sets around a role's loop
        return asyncio.run(tool.run(arguments, context))


def test_tools_are_offered_with_their_effects_and_called(docs: DocsServer) -> None:
    mcp_server_create(name="docs", url=docs.url)
    specs = {s.name: s for s in MCP_TOOLS.specs()}
    assert specs["mcp__docs__search"].effect is Effect.READ
    assert specs["mcp__docs__add_note"].effect is Effect.WRITE
    assert specs["mcp__docs__delete_page"].effect is Effect.EXTERNAL
    assert specs["mcp__docs__search"].parameters["required"] == ["query"]

    found = _call("mcp__docs__search", {"query": "agent"})
    assert found == ToolResult("intro: Loopwright runs agent loops.")
    failed = _call("mcp__docs__fail", {"reason": "no such page"})
    assert failed.is_error and "no such page" in failed.content
    assert docs.names() == ["search", "fail"]


def test_an_image_block_of_an_answer_becomes_an_image_of_the_result(docs: DocsServer) -> None:
    """An ImageContent block comes back as a data URL in ``ToolResult.images``; the text keeps
    a placeholder for it, so it still makes sense alone."""
    mcp_server_create(name="docs", url=docs.url)
    charted = _call("mcp__docs__chart", {"page": "intro"})
    assert charted.images == (f"data:image/png;base64,{CHART_PNG}",)
    assert charted.content.startswith("Visits of intro:\n[image 1: image/png, about ")
    assert CHART_PNG not in charted.content and not charted.is_error


def test_an_image_of_an_mcp_tool_reaches_a_vision_model_as_an_image_part(
    docs: DocsServer, model_server: ModelServer
) -> None:
    """Through the tool loop: the chart's image follows the tool message as an ``image_url``
    part of a ``user`` message, for an endpoint that accepts images."""
    mcp_server_create(name="docs", url=docs.url)
    chart = Completion(tool_calls=[("mcp__docs__chart", '{"page": "intro"}')])
    model_server.queue(chart, Completion(content="Done."))
    invoker = ToolLoopInvoker(
        model_clients=lambda _username: model_client(model_server),
        tools=ToolRegistry(providers=[MCP_TOOLS]),
        policy=lambda _request: ToolPolicy.from_decisions({"mcp__docs__chart": "allow"}),
        vision=True,
        endpoint_name="primary",
    )
    request = make_request(harness={"settings": ALLOW})
    outcome = asyncio.run(invoker.invoke(request, MemoryJournal()))
    assert outcome.kind is OutcomeKind.COMPLETED, outcome
    *_, tool, user = model_server.bodies[1]["messages"]
    assert tool["content"].startswith("Visits of intro:\n[image 1: image/png, about ")
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{CHART_PNG}"}}
    assert user["role"] == "user" and user["content"][-1] == image


def test_the_harness_offers_only_the_tools_of_allowed_connectors(docs: DocsServer) -> None:
    mcp_server_create(name="docs", url=docs.url)
    specs = MCP_TOOLS.specs()
    settings = {
        "tools": {
            "allow": ["*"],
            "ask": [],
            "deny": [],
            "effects": {},
            "trustedPreHandlerTools": [],
        },
        "isolation": {"allowedConnectors": ["docs"]},
    }
    plan = plan_tools(settings, specs)
    assert plan.decision("mcp__docs__search") is Decision.ALLOW  # read
    assert plan.decision("mcp__docs__add_note") is Decision.ASK  # write: a human gate
    assert plan.decision("mcp__docs__delete_page") is Decision.ASK  # high-risk
    closed = plan_tools({**settings, "isolation": {"allowedConnectors": ["github"]}}, specs)
    assert closed.decision("mcp__docs__search") is Decision.DENY
    assert "isolation.allowedConnectors" in closed.by_name["mcp__docs__search"].reason
    # A snapshot that does not state the section allows no connector (fail closed).
    assert plan_tools({"tools": settings["tools"]}, specs).decision("mcp__docs__search") is (
        Decision.DENY
    )


def test_a_reissued_call_is_resent_only_when_it_cannot_act_twice(docs: DocsServer) -> None:
    mcp_server_create(name="docs", url=docs.url)
    again = _call("mcp__docs__add_note", {"text": "hi"}, reissued=True)
    assert again.is_error and "outcome is unknown" in again.content
    gone = _call("mcp__docs__delete_page", {"page": "intro"}, reissued=True)
    assert gone.is_error and "not sent again" in gone.content
    assert docs.names() == []
    assert not _call("mcp__docs__search", {"query": "demo"}, reissued=True).is_error
    assert not _call("mcp__docs__tag_page", {"page": "intro", "tag": "x"}, reissued=True).is_error
    assert docs.names() == ["search", "tag_page"]


def test_a_server_that_is_down_gives_tool_errors_and_opens_its_breaker(docs: DocsServer) -> None:
    mcp_server_create(name="docs", url=docs.url)
    docs.stop()
    for _ in range(FAILURE_THRESHOLD):
        failed = _call("mcp__docs__search", {"query": "x"})
        assert failed.is_error and "MCP server docs failed on search" in failed.content
    refused = _call("mcp__docs__search", {"query": "x"})
    assert refused.is_error and "circuit is open" in refused.content


def test_the_idempotency_key_travels_in_the_request_meta(docs: DocsServer) -> None:
    mcp_server_create(name="docs", url=docs.url)
    assert not _call("mcp__docs__add_note", {"text": "x"}).is_error
    ((name, arguments, meta),) = docs.calls
    assert (name, arguments) == ("add_note", {"text": "x"})
    assert meta[IDEMPOTENCY_META] == "run:3:mcp__docs__add_note"


def test_a_call_reaches_only_a_server_the_roles_network_reaches(docs: DocsServer) -> None:
    mcp_server_create(name="docs", url=docs.url)
    denied = _call("mcp__docs__search", {"query": "x"}, harness=None)
    assert denied.is_error and "isolation.networkAccess is deny" in denied.content
    elsewhere = {"isolation": {"networkAccess": "restricted", "allowedHosts": ["api.example.com"]}}
    refused = _call("mcp__docs__search", {"query": "x"}, harness=elsewhere)
    assert (
        refused.is_error and "'127.0.0.1' is not in its isolation.allowedHosts" in refused.content
    )
    listed = {"isolation": {"networkAccess": "restricted", "allowedHosts": ["127.0.0.1"]}}
    assert not _call("mcp__docs__search", {"query": "x"}, harness=listed).is_error
    assert docs.names() == ["search"]  # the refused calls never reached the server

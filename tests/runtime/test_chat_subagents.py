"""A sub-agent dispatched inside a request-scoped chat: its progress reaches the sink tagged
with its task id and depth, and its model usage is merged into the request's."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runtime.chat import ChatTurn, chat_complete
from runtime.tools.base import Invocation
from runtime.tools.subagents import (
    SUB_AGENT_TOOL,
    BoundSubAgent,
    ChildLimits,
    DispatchSubAgentTool,
    SubAgentChild,
)
from tests.runtime.chat_helpers import Recorder, WeatherTool, make_invoker, user
from tests.support.model_server import Completion, ModelServer

pytestmark = pytest.mark.anyio

HARNESS = {
    "settings": {"delegation": {"maxDepth": 1, "maxCount": 2, "allowedEmployees": ["*"]}},
    "provenance": {},
}


class OneChild:
    """A host with one bound employee, ``bob``, whose loop has the weather tool."""

    def __init__(self, server: ModelServer, lookup: WeatherTool) -> None:
        self.server = server
        self.lookup = lookup

    async def bindings(self, parent: str) -> list[BoundSubAgent]:
        return [BoundSubAgent("bob")]

    async def child(
        self, parent: Invocation, employee: str, binding: BoundSubAgent, limits: ChildLimits
    ) -> SubAgentChild:
        invoker = make_invoker(self.server, [self.lookup], max_steps=limits.max_steps)
        return SubAgentChild(employee=employee, invoker=invoker, harness=HARNESS)


async def test_a_sub_agents_events_and_usage_reach_the_request(model_server: ModelServer):
    lookup = WeatherTool()
    dispatch = DispatchSubAgentTool(OneChild(model_server, lookup))
    task = {"employee": "bob", "task": "Weather in Oslo?"}
    model_server.queue(
        Completion(tool_calls=[(SUB_AGENT_TOOL, json.dumps(task))], usage=(100, 10)),
        Completion(tool_calls=[("lookup", '{"city": "Oslo"}')], usage=(20, 2)),  # bob
        Completion(content="Oslo is sunny.", usage=(30, 3)),  # bob's conclusion
        Completion(content="Bob says Oslo is sunny.", usage=(200, 20)),
    )
    sink = Recorder()

    result = await chat_complete(
        make_invoker(model_server, [dispatch]),
        employee="ada",
        harness=HARNESS,
        turn=ChatTurn((user("Ask Bob about Oslo."),)),
        sink=sink,
    )

    assert result.content == "Bob says Oslo is sunny."
    assert lookup.finished == [{"city": "Oslo"}]
    # Every model step of the request counts, the sub-agent's too; steps are the parent's.
    assert (result.prompt_tokens, result.completion_tokens) == (350, 35)
    assert result.model_steps == 2
    events: list[dict[str, Any]] = sink.agent()
    kinds = [(e["type"], e.get("name"), e.get("depth")) for e in events]
    assert kinds == [
        ("tool_started", SUB_AGENT_TOOL, None),
        ("sub_agent_started", None, 1),
        ("tool_started", "lookup", 1),
        ("tool_finished", "lookup", 1),
        ("sub_agent_finished", None, 1),
        ("tool_finished", SUB_AGENT_TOOL, None),
    ]
    task_ids = {e["task_id"] for e in events if "depth" in e}
    assert len(task_ids) == 1
    # The child started from the task alone, not from the parent's conversation.
    child_messages = model_server.bodies[1]["messages"]
    assert "Ask Bob about Oslo." not in json.dumps(child_messages)
    assert "Weather in Oslo?" in json.dumps(child_messages)

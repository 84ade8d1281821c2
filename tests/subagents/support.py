"""A sub-agent host without Django, over loopback model servers, for the runtime tests."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from runtime.invocation import InvocationRequest, LoopRole
from runtime.loop import LoopSettings, ToolLoopInvoker
from runtime.model_client import OpenAICompatibleClient
from runtime.model_config import EndpointConfig, RetryPolicy
from runtime.policy import ToolPolicy
from runtime.sub_agent_loop import child_tool_loop
from runtime.tools import ToolRegistry
from runtime.tools.base import Invocation, ToolError
from runtime.tools.subagents import (
    BoundSubAgent,
    ChildLimits,
    DispatchSubAgentTool,
    SubAgentChild,
)
from runtime.tools.todo import TodoTool
from tests.support.model_server import ModelServer

FAST = RetryPolicy(base_delay=0.01, max_delay=0.02, max_retry_after=1)


def client_of(server: ModelServer, name: str = "ep") -> OpenAICompatibleClient:
    config = EndpointConfig(name=name, base_url=server.url, model="test-model", max_retries=0)
    return OpenAICompatibleClient(config, retry=FAST)


@dataclass
class ChildSpec:
    server: ModelServer
    prompt: str = "You are a careful helper."
    max_steps: int = 12
    tools: tuple[str, ...] = ()
    decisions: dict[str, Any] = field(default_factory=dict)


@dataclass
class StaticHost:
    """Bindings by parent; children by username, each on its own model server."""

    bindings_of: dict[str, list[BoundSubAgent]]
    children: dict[str, ChildSpec]
    registry: ToolRegistry | None = None
    built: list[tuple[str, ChildLimits]] = field(default_factory=list)

    async def bindings(self, parent: str) -> list[BoundSubAgent]:
        return list(self.bindings_of.get(parent, []))

    async def child(
        self, parent: Invocation, employee: str, binding: BoundSubAgent, limits: ChildLimits
    ) -> SubAgentChild:
        spec = self.children.get(employee)
        if spec is None:
            raise ToolError(f"no employee {employee}")
        self.built.append((employee, limits))
        tools = self.registry or ToolRegistry()
        decisions = spec.decisions or {name: "allow" for name in spec.tools}
        invoker = child_tool_loop(
            client=client_of(spec.server, employee),
            tools=tools,
            policy=ToolPolicy.from_decisions(decisions),
            settings=LoopSettings(max_steps=spec.max_steps),
            system_prompt=spec.prompt,
            limits=limits,
            bound_tools=spec.tools,
        )
        return SubAgentChild(
            employee=employee,
            invoker=invoker,
            harness={"settings": parent.harness, "provenance": parent.harness_provenance},
        )


def delegation(allowed: list[str] | None = None, depth: int = 1, count: int = 5) -> dict[str, Any]:
    return {
        "settings": {
            "delegation": {
                "allowedEmployees": ["*"] if allowed is None else allowed,
                "maxDepth": depth,
                "maxCount": count,
            }
        },
        "provenance": {"delegation.maxDepth": "profile:team@2"},
    }


def parent_request(
    harness: dict[str, Any], *, name: str = "maker:0", goal: str = "PARENT SECRET GOAL"
) -> InvocationRequest:
    return InvocationRequest(
        run_id=uuid.uuid4(),
        role=LoopRole.MAKER,
        invocation=name,
        employee_username="boss",
        goal=goal,
        harness=harness,
    )


def parent_loop(
    server: ModelServer,
    host: StaticHost,
    *,
    tool_timeout: float = 30.0,
    todo: TodoTool | None = None,
) -> ToolLoopInvoker:
    registry = ToolRegistry([DispatchSubAgentTool(host), todo or TodoTool()])
    host.registry = host.registry or registry
    return ToolLoopInvoker(
        model_clients=lambda _u: client_of(server, "boss"),
        tools=registry,
        policy=lambda _r: ToolPolicy.from_decisions(
            {"dispatch_sub_agent_task": "allow", "todo": "allow"}
        ),
        settings=LoopSettings(max_steps=6, tool_timeout_seconds=tool_timeout),
    )

"""What the request-scoped chat tests share: small real tools, an invoker wired to the loopback
model server, and a sink that records what a streamed answer reported."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from runtime.chat import ChatEvent
from runtime.loop import LoopSettings, ToolLoopInvoker
from runtime.model_client import OpenAICompatibleClient
from runtime.model_config import EndpointConfig, ModelParams, RetryPolicy
from runtime.policy import ToolPolicy
from runtime.tools import ToolContext, ToolRegistry, ToolResult
from runtime.types import Effect, ToolSpec
from tests.support.model_server import ModelServer

CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
EMPLOYEE_PROMPT = "You are Ada, the weather desk."


class WeatherTool:
    """A read tool that answers from a table and remembers what it was asked."""

    def __init__(self, name: str = "lookup", effect: Effect = Effect.READ, sleep: float = 0.0):
        self.spec = ToolSpec(name, "Weather of a city.", CITY_SCHEMA, effect)
        self.sleep = sleep
        self.calls: list[dict[str, Any]] = []
        self.finished: list[dict[str, Any]] = []
        self.started = asyncio.Event()
        self.cancelled = False

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        self.calls.append(arguments)
        self.started.set()
        try:
            await asyncio.sleep(self.sleep)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        self.finished.append(arguments)
        return ToolResult(f"{arguments['city']}: sunny, 21 C")


def model_client(server: ModelServer, **params: Any) -> OpenAICompatibleClient:
    config = EndpointConfig(
        name="primary",
        base_url=server.url,
        model="test-model",
        max_retries=0,
        params=ModelParams(**params),
    )
    return OpenAICompatibleClient(config, retry=RetryPolicy(base_delay=0.01, max_delay=0.02))


def make_invoker(
    server: ModelServer,
    tools: list[Any],
    decisions: dict[str, str | tuple[str, str]] | None = None,
    *,
    params: dict[str, Any] | None = None,
    **settings: Any,
) -> ToolLoopInvoker:
    """The employee's loop: its prompt, its tools under ``decisions`` (default: allow all)."""
    client = model_client(server, **(params or {}))
    policy = ToolPolicy.from_decisions(decisions or {t.spec.name: "allow" for t in tools})
    return ToolLoopInvoker(
        model_clients=lambda _username: client,
        tools=ToolRegistry(tools),
        policy=lambda _request: policy,
        settings=LoopSettings(**settings),
        system_prompt=lambda _request: EMPLOYEE_PROMPT,
    )


class Recorder:
    """A chat sink: every event, with when it arrived."""

    def __init__(self) -> None:
        self.events: list[tuple[float, ChatEvent]] = []
        self.first = asyncio.Event()

    async def __call__(self, event: ChatEvent) -> None:
        self.events.append((time.monotonic(), event))
        if event.kind == "content":
            self.first.set()

    def text(self, kind: str) -> str:
        return "".join(event.text for _, event in self.events if event.kind == kind)

    def agent(self) -> list[dict[str, Any]]:
        return [event.data for _, event in self.events if event.kind == "agent"]

    def kinds(self) -> list[str]:
        return [
            str(event.data["type"]) if event.kind == "agent" else event.kind
            for _, event in self.events
        ]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def client_tool(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": f"{name} on the user's device", "parameters": {}},
    }

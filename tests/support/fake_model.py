"""In-process fakes for runtime tests: a scripted ModelClient and recording tools.

Each ``complete`` call takes the next scripted reply: a ChatResponse, an exception to raise, or
a function of the request (sync or async) for replies that depend on what the loop sent. Every
request is kept, so tests can assert what the model was shown. Calling it more often than
scripted fails loudly.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import uuid
from collections.abc import Callable
from typing import Any

from runtime.invocation import InvocationOutcome, InvocationRequest, LoopRole
from runtime.loop import LoopSettings, ToolLoopInvoker
from runtime.policy import ToolPolicy
from runtime.tools import Tool, ToolContext, ToolError, ToolRegistry, ToolResult
from runtime.types import ChatRequest, ChatResponse, Effect, ToolCall, ToolSpec, Usage
from tests.support.journal import MemoryJournal

Reply = ChatResponse | BaseException | Callable[[ChatRequest], Any]

_ids = itertools.count(1)


class ScriptedModel:
    def __init__(self, *replies: Reply) -> None:
        self.replies: list[Reply] = list(replies)
        self.requests: list[ChatRequest] = []

    def add(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        if not self.replies:
            raise AssertionError(f"model called {len(self.requests)} times; not scripted")
        reply = self.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, ChatResponse):
            return reply
        result = reply(request)
        return await result if inspect.isawaitable(result) else result

    @property
    def remaining(self) -> int:
        return len(self.replies)


def text(
    content: str, *, prompt_tokens: int = 10, completion_tokens: int = 5, cost: float = 0.0
) -> ChatResponse:
    return ChatResponse(
        content=content,
        usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens),
        finish_reason="stop",
        model="scripted",
        cost=cost,
    )


def call(name: str, arguments: dict[str, Any] | str | None = None, *, id: str = "") -> ToolCall:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return ToolCall(id=id or f"call_{next(_ids)}", name=name, arguments=raw)


def calls(*tool_calls: ToolCall | tuple[str, Any], content: str = "") -> ChatResponse:
    made = [c if isinstance(c, ToolCall) else call(c[0], c[1]) for c in tool_calls]
    return ChatResponse(
        content=content,
        tool_calls=made,
        usage=Usage(prompt_tokens=10, completion_tokens=5),
        finish_reason="tool_calls",
        model="scripted",
    )


class Hang:
    """A reply that never comes: records that the model call started and was cancelled."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = False

    async def __call__(self, request: ChatRequest) -> ChatResponse:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        raise AssertionError("unreachable")


def last_tool_messages(request: ChatRequest) -> list[str]:
    """Contents of the tool messages at the end of a request (the latest step's results)."""
    out: list[str] = []
    for message in reversed(request.messages):
        if message.get("role") == "tool":
            out.append(str(message.get("content")))
        elif out:
            break
    return list(reversed(out))


def factory(model: ScriptedModel) -> Callable[[str], ScriptedModel]:
    return lambda username: model


# --- tools -----------------------------------------------------------------------------------

OPEN_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


class RecordingTool:
    """A tool that records every call (arguments, context) and how many ran at once.

    ``result`` may be a string, a ToolResult, or a function of the arguments; ``fail`` makes it
    raise a ToolError with that message; ``sleep`` (a number or a function of the arguments)
    makes it take that long.
    """

    def __init__(
        self,
        name: str,
        effect: Effect = Effect.READ,
        *,
        result: str | ToolResult | Callable[[dict[str, Any]], str] = "ok",
        sleep: float | Callable[[dict[str, Any]], float] = 0.0,
        fail: str = "",
        parameters: dict[str, Any] | None = None,
    ) -> None:
        self.spec = ToolSpec(
            name=name,
            description=f"test tool {name}",
            parameters=parameters or OPEN_SCHEMA,
            effect=effect,
        )
        self.result, self.sleep, self.fail = result, sleep, fail
        self.calls: list[tuple[dict[str, Any], ToolContext]] = []
        self.finished: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.cancelled = 0
        self.started = asyncio.Event()

    @property
    def keys(self) -> list[str]:
        return [context.idempotency_key for _, context in self.calls]

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        self.calls.append((arguments, context))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.started.set()
        try:
            delay = self.sleep(arguments) if callable(self.sleep) else self.sleep
            await asyncio.sleep(delay)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1
        if self.fail:
            raise ToolError(self.fail)
        self.finished.append(arguments)
        if isinstance(self.result, ToolResult):
            return self.result
        return ToolResult(self.result(arguments) if callable(self.result) else self.result)


def make_request(**overrides: Any) -> InvocationRequest:
    values: dict[str, Any] = {
        "run_id": uuid.uuid4(),
        "role": LoopRole.MAKER,
        "invocation": "maker:0",
        "employee_username": "ada",
        "goal": "Do the thing.",
        "harness": {},
    }
    values.update(overrides)
    return InvocationRequest(**values)


def make_invoker(
    model: ScriptedModel,
    tools: list[Tool],
    decisions: dict[str, Any] | None = None,
    *,
    allow_rest: bool = True,
    **settings: Any,
) -> ToolLoopInvoker:
    """An invoker over ``tools`` with a tool plan of ``decisions``; the tools it does not name
    are allowed, unless ``allow_rest`` is False (then they are outside the plan)."""
    plan: dict[str, Any] = {tool.spec.name: "allow" for tool in tools} if allow_rest else {}
    plan.update(decisions or {})
    return ToolLoopInvoker(
        model_clients=factory(model),
        tools=ToolRegistry(tools),
        policy=lambda request: ToolPolicy.from_decisions(plan),
        settings=LoopSettings(**settings),
    )


def invoke(
    invoker: ToolLoopInvoker,
    journal: MemoryJournal | None = None,
    request: InvocationRequest | None = None,
) -> tuple[InvocationOutcome, MemoryJournal]:
    """Run one invocation to its outcome (in a fresh event loop) and return the journal."""
    journal = journal if journal is not None else MemoryJournal()
    outcome = asyncio.run(invoker.invoke(request or make_request(), journal))
    return outcome, journal

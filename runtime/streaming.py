"""Streaming Chat Completions: chunk assembly and tool-call detection (docs/model-client.md).

In the OpenAI streaming protocol nothing announces whether tool calls will follow some text,
yet live text must reach the user early. :class:`StreamRouter` decides when text may be
released to the ``on_text`` callback:

- ``auto`` (default): without tools, the first text decides plain text (real time). With tools,
  text is held for a short window (500 ms) after the first text; a tool call inside the window
  means "tool calls" (the text was a preamble and is not released), otherwise the held text is
  released and the rest streams live.
- ``firstContent``: the first non-empty text decides plain text at once.
- ``drain``: read the whole stream first; release the text at the end only when there were no
  tool calls.

When a tool call arrives after text was already released (a long GLM-style preamble in
``auto`` or ``firstContent``), the router raises :class:`RoutedAsPlainText`; the client then
upgrades itself to ``drain`` and re-runs the round (self-healing).

Reasoning deltas are never held: they go to the router's ``on_reasoning`` as they arrive.

:class:`StreamAccumulator` assembles the response: text, reasoning, usage, and tool calls whose
id, name and argument fragments arrive spread over many chunks, keyed by ``index``.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import json
import time
from collections.abc import AsyncIterable, Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Literal

from runtime.types import ChatResponse, ToolCall, Usage

StreamMode = Literal["auto", "firstContent", "drain"]
STREAM_MODES: tuple[StreamMode, ...] = ("auto", "firstContent", "drain")
TextCallback = Callable[[str], Awaitable[None] | None]
DEFAULT_AUTO_WINDOW_SECONDS = 0.5


class RoutedAsPlainText(Exception):
    """Tool calls arrived after the text of this round had already been released as plain text."""


async def emit(callback: TextCallback | None, text: str) -> None:
    """Hand ``text`` to a sync or async callback."""
    if callback is None or not text:
        return
    result = callback(text)
    if inspect.isawaitable(result):
        await result


# --- assembly -----------------------------------------------------------------------------------


@dataclass
class _PartialToolCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def merge(self, delta: dict[str, Any]) -> None:
        if delta.get("id"):
            self.id = str(delta["id"])
        function = delta.get("function") or {}
        name = str(function.get("name") or "")
        # Most providers send the name once; some repeat it whole, a few split it in pieces.
        if name and name != self.name:
            self.name = self.name + name if self.name and not delta.get("id") else name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            self.arguments.append(arguments)
        elif arguments is not None:
            # An already-parsed argument object: keep it as JSON text for the loop to validate.
            self.arguments.append(json.dumps(arguments))


@dataclass(frozen=True)
class ChunkDelta:
    """What one chunk contributed, as the router needs it."""

    text: str = ""
    reasoning: str = ""
    tool_call: bool = False


@dataclass
class StreamAccumulator:
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, _PartialToolCall] = field(default_factory=dict)
    finish_reason: str = ""
    model: str = ""
    usage: Usage = field(default_factory=Usage)

    def feed(self, chunk: dict[str, Any]) -> ChunkDelta:
        self.model = str(chunk.get("model") or self.model)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage_from_wire(usage)
        choices = chunk.get("choices") or []
        if not choices:
            return ChunkDelta()
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])
        delta = choice.get("delta") or {}
        text = delta.get("content") or ""
        reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
        self.content.append(text)
        self.reasoning.append(reasoning)
        tool_deltas = delta.get("tool_calls") or []
        for tool_delta in tool_deltas:
            self._merge_tool_delta(tool_delta)
        return ChunkDelta(text=text, reasoning=reasoning, tool_call=bool(tool_deltas))

    def _merge_tool_delta(self, delta: dict[str, Any]) -> None:
        index = delta.get("index")
        if not isinstance(index, int):
            # Index-less providers: a delta with a new id starts a call, others continue the last.
            known = {call.id for call in self.calls.values()}
            starts = bool(delta.get("id")) and delta.get("id") not in known
            index = len(self.calls) if starts or not self.calls else max(self.calls)
        self.calls.setdefault(index, _PartialToolCall()).merge(delta)

    def tool_calls(self) -> list[ToolCall]:
        return [
            ToolCall(
                id=call.id or f"call_{index}", name=call.name, arguments="".join(call.arguments)
            )
            for index, call in sorted(self.calls.items())
        ]

    def response(
        self, *, endpoint: str, cost: Callable[[Usage], float], model: str = ""
    ) -> ChatResponse:
        """The assembled answer, as ``parse_completion`` gives a non-streamed one (``model`` is
        the fallback when no chunk named one)."""
        return ChatResponse(
            content="".join(self.content),
            tool_calls=self.tool_calls(),
            reasoning_content="".join(self.reasoning),
            usage=self.usage,
            finish_reason=self.finish_reason,
            model=self.model or model,
            endpoint=endpoint,
            cost=cost(self.usage),
        )


def usage_from_wire(usage: dict[str, Any]) -> Usage:
    return Usage(
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
    )


# --- routing ------------------------------------------------------------------------------------


class Route(enum.StrEnum):
    UNDECIDED = "undecided"
    WATCHING = "watching"  # auto mode: text seen, inside the observation window
    TEXT = "text"  # released as plain text; further text streams live
    TOOLS = "tools"  # tool calls: text is a preamble and is not released


class StreamRouter:
    """Decides, per mode, when text is released to ``on_text`` (see the module docstring)."""

    def __init__(
        self,
        *,
        mode: StreamMode,
        tools_offered: bool,
        on_text: TextCallback | None,
        window: float = DEFAULT_AUTO_WINDOW_SECONDS,
        on_reasoning: TextCallback | None = None,
    ) -> None:
        # Pure-conversation rounds cannot be misjudged: they always stream in real time.
        self.mode: StreamMode = mode if tools_offered else "firstContent"
        self.tools_offered = tools_offered
        self.on_text = on_text
        #: Reasoning deltas go here as they arrive, never held (they are not the answer).
        self.on_reasoning = on_reasoning
        self.window = window
        self.route = Route.UNDECIDED
        self.held: list[str] = []
        self.deadline: float | None = None
        self.emitted = False

    async def text(self, delta: str, now: float) -> None:
        if not delta:
            return
        if self.route is Route.TEXT:
            await self._release(delta)
        elif self.route is Route.TOOLS or self.mode == "drain":
            self.held.append(delta)
        elif self.mode == "firstContent":
            self.route = Route.TEXT
            await self._release(delta)
        elif self.route is Route.UNDECIDED:
            self.route, self.deadline = Route.WATCHING, now + self.window
            self.held.append(delta)
        else:  # WATCHING
            self.held.append(delta)
            await self.tick(now)

    async def reasoning(self, delta: str) -> None:
        await emit(self.on_reasoning, delta)

    async def tool_call(self) -> None:
        if self.route is Route.TEXT and self.tools_offered:
            raise RoutedAsPlainText("tool calls arrived after the text was routed as plain text")
        if self.route is not Route.TEXT:
            self.route, self.deadline = Route.TOOLS, None

    async def tick(self, now: float) -> None:
        """The observation window ran out with no tool call: release what was held."""
        if self.route is Route.WATCHING and self.deadline is not None and now >= self.deadline:
            self.route, self.deadline = Route.TEXT, None
            await self._flush()

    async def end(self) -> None:
        """End of stream: held text is plain text unless tool calls were seen."""
        if self.route is not Route.TOOLS:
            self.route, self.deadline = Route.TEXT, None
            await self._flush()

    async def _flush(self) -> None:
        held, self.held = "".join(self.held), []
        await self._release(held)

    async def _release(self, text: str) -> None:
        if text:
            self.emitted = True
            await emit(self.on_text, text)


_END = object()


async def route_stream(
    chunks: AsyncIterable[dict[str, Any]],
    accumulator: StreamAccumulator,
    router: StreamRouter,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Feed every chunk to the accumulator and the router until the stream ends.

    Chunks are read by a separate task into a queue so the auto-mode window can expire (and the
    held text be released) while the model is silent, without cancelling a pending socket read.
    """
    queue: asyncio.Queue[object] = asyncio.Queue()
    reader = asyncio.create_task(_read_into(chunks, queue))
    try:
        while (item := await _next_item(queue, router, clock)) is not _END:
            if isinstance(item, Exception):
                raise item
            if item is None:  # the window expired
                await router.tick(clock())
                continue
            assert isinstance(item, dict)
            delta = accumulator.feed(item)
            await router.reasoning(delta.reasoning)
            # Tool calls first: a chunk carrying both is a tool-call chunk, not plain text.
            if delta.tool_call:
                await router.tool_call()
            await router.text(delta.text, clock())
        await router.end()
    finally:
        reader.cancel()
        with suppress(asyncio.CancelledError):
            await reader


async def _read_into(chunks: AsyncIterable[dict[str, Any]], queue: asyncio.Queue[object]) -> None:
    try:
        async for chunk in chunks:
            queue.put_nowait(chunk)
    except Exception as exc:  # handed to the consumer, which raises it in its own task
        queue.put_nowait(exc)
        return
    queue.put_nowait(_END)


async def _next_item(
    queue: asyncio.Queue[object], router: StreamRouter, clock: Callable[[], float]
) -> object:
    if router.deadline is None:
        return await queue.get()
    try:
        return await asyncio.wait_for(queue.get(), timeout=max(0.0, router.deadline - clock()))
    except TimeoutError:
        return None

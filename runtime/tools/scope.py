"""What a tool call knows of the invocation it serves, beyond ``ToolContext.invocation``.

:func:`invoke_scoped` (or :func:`invocation_scope` around ``ToolLoopInvoker.invoke``) makes the
invocation's journal, its sinks for agent events and usage and the run's autonomy level visible
to the tools it runs (a context variable: the tool calls' tasks inherit it). The sub-agent tool
makes child journals from it (:func:`child_journal`) and the ``todo`` tool restores its list
from it. :class:`MeteredJournal` is a child's journal seen from its parent: it counts the
child's usage and reports the child's tool calls, tagged with its task id and depth.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from runtime.invocation import (
    InvocationOutcome,
    InvocationRequest,
    RecordedCall,
    RoleInvoker,
    StepJournal,
    StepRecord,
)
from runtime.scrub import ScrubbingJournal
from runtime.tools.ephemeral import EphemeralJournal

T = TypeVar("T")

#: What separates a parent's invocation name from its child's: depth = occurrences.
SUB_MARK = "/sub:"

EventSink = Callable[[dict[str, Any]], Awaitable[None] | None]
UsageSink = Callable[[int, int, float], None]


@dataclass
class InvocationScope:
    """The invocation a tool call serves, beyond :class:`Invocation`: its journal (for child
    journals and resumable state), sinks for sub-agent events and usage, and state kept by
    the invocation's tools (the todo list, the sub-agents dispatched)."""

    journal: StepJournal
    events: EventSink | None = None
    usage: UsageSink | None = None
    #: The run's autonomy level (``L1``..``L3``; None: as L1), which gates a child's tools as it
    #: gates its parent's; children inherit it.
    autonomy_level: str | None = None
    #: Idempotency keys of the sub-agent calls of this invocation (None: not read yet).
    dispatched: set[str] | None = None
    state: dict[str, Any] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


_SCOPE: contextvars.ContextVar[InvocationScope | None] = contextvars.ContextVar(
    "loopwright_invocation_scope", default=None
)


def current_scope() -> InvocationScope | None:
    """The scope of the invocation whose tool call is running; None outside any."""
    return _SCOPE.get()


@contextlib.contextmanager
def invocation_scope(
    journal: StepJournal,
    *,
    events: EventSink | None = None,
    usage: UsageSink | None = None,
    autonomy_level: str | None = None,
) -> Iterator[InvocationScope]:
    """Make ``journal`` the journal the tool calls of the invocation run inside see; wrap
    ``ToolLoopInvoker.invoke`` in it (the tool calls' tasks inherit it)."""
    scope = InvocationScope(journal, events, usage, autonomy_level)
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


async def invoke_scoped(
    invoker: RoleInvoker,
    request: InvocationRequest,
    journal: StepJournal,
    *,
    events: EventSink | None = None,
    usage: UsageSink | None = None,
) -> InvocationOutcome:
    """``invoker.invoke(request, journal)`` inside :func:`invocation_scope` (the run's autonomy
    level from ``request.context``)."""
    level = request.context.get("autonomy_level")
    with invocation_scope(
        journal, events=events, usage=usage, autonomy_level=level if level else None
    ):
        return await invoker.invoke(request, journal)


async def child_journal(parent: StepJournal, invocation: str) -> StepJournal:
    """The journal of child invocation ``invocation``: the parent's own kind when it can make
    one (``sub_journal``: the engine's persists it), an in-memory one otherwise; a scrubbing
    parent scrubs its child too."""
    if isinstance(parent, ScrubbingJournal):
        inner = await child_journal(parent.inner, invocation)
        return ScrubbingJournal(inner, parent.secrets, parent.patterns)
    make = getattr(parent, "sub_journal", None)
    if make is not None:
        made = make(invocation)
        journal: StepJournal = await made if inspect.isawaitable(made) else made
        return journal
    return EphemeralJournal()


async def emit(scope: InvocationScope | None, event: dict[str, Any]) -> None:
    """Send ``event`` to the scope's event sink, if it has one."""
    if scope is None or scope.events is None:
        return
    sent = scope.events(event)
    if inspect.isawaitable(sent):
        await sent


class MeteredJournal:
    """The child's journal, counting its model usage (for the tool's result and the parent's
    usage sink) and passing its events on, tagged, to the parent's event sink."""

    def __init__(
        self, inner: StepJournal, scope: InvocationScope | None, depth: int, name: str
    ) -> None:
        self.inner = inner
        self.scope = scope
        self.depth = depth
        self.task_id = name.rsplit(SUB_MARK, 1)[-1]
        self.tokens_in = self.tokens_out = 0
        self.cost = 0.0
        #: Tool steps begun and not finished: seq -> (call id, tool, start).
        self._running: dict[int, tuple[str, str, float]] = {}

    async def _tell(self, event: dict[str, Any]) -> None:
        if self.scope is not None and self.scope.events is not None:
            await emit(self.scope, {**event, "task_id": self.task_id, "depth": self.depth})

    async def _tool_started(self, seq: int, name: str, request: dict[str, Any]) -> None:
        call_id = str(request.get("call_id") or "")
        self._running[seq] = (call_id, name, time.monotonic())
        await self._tell({"type": "tool_started", "call_id": call_id, "name": name})

    async def _tool_finished(self, seq: int, outcome: str) -> None:
        running = self._running.pop(seq, None)
        if running is None:
            return
        call_id, name, started = running
        duration = int((time.monotonic() - started) * 1000)
        await self._tell(
            {
                "type": "tool_finished",
                "call_id": call_id,
                "name": name,
                "duration_ms": duration,
                "outcome": outcome,
            }
        )

    # --- passed through ---------------------------------------------------------------------

    async def steps(self) -> list[StepRecord]:
        return await self.inner.steps()

    async def resume_point(self) -> tuple[str | None, list[StepRecord]]:
        return await self.inner.resume_point()

    async def save_checkpoint(self, upto_seq: int, state: str) -> None:
        await self.inner.save_checkpoint(upto_seq, state)

    async def begin(
        self, *, kind: str, name: str, request: dict[str, Any], idempotency_key: str = ""
    ) -> int:
        seq = await self.inner.begin(
            kind=kind, name=name, request=request, idempotency_key=idempotency_key
        )
        if kind == "tool":
            await self._tool_started(seq, name, request)
        return seq

    def runs_first(self, name: str, request: dict[str, Any]) -> bool:
        return self.inner.runs_first(name, request)

    async def record_call(self, **fields: Any) -> RecordedCall:
        recorded = await self.inner.record_call(**fields)
        await self._tool_started(recorded.seq, str(fields.get("name")), fields.get("request") or {})
        if recorded.completed:
            await self._tool_finished(recorded.seq, "error" if fields.get("error") else "ok")
        return recorded

    async def ask(self, seq: int, *, question: str) -> None:
        await self.inner.ask(seq, question=question)

    async def gate(
        self, *, name: str, request: dict[str, Any], idempotency_key: str, reason: str
    ) -> int:
        return await self.inner.gate(
            name=name, request=request, idempotency_key=idempotency_key, reason=reason
        )

    def idempotency_key(self, step_seq: int, call_index: int = 0) -> str:
        return self.inner.idempotency_key(step_seq, call_index)

    async def admit_model_call(self) -> None:
        await self.inner.admit_model_call()

    async def authorize(self, seq: int, name: str, arguments: dict[str, Any]) -> str:
        return await self.inner.authorize(seq, name, arguments)

    def tool_notice(self, seq: int) -> str:
        return self.inner.tool_notice(seq)

    async def db_call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self.inner.db_call(fn, *args, **kwargs)

    async def sub_journal(self, invocation: str) -> StepJournal:
        return await child_journal(self.inner, invocation)

    # --- counted ------------------------------------------------------------------------------

    async def record(self, **fields: Any) -> int:
        seq: int = await self.inner.record(**fields)
        self._count(fields)
        if fields.get("kind") == "tool":  # a call answered without running
            await self._tool_started(seq, str(fields.get("name")), fields.get("request") or {})
            await self._tool_finished(seq, "error" if fields.get("error") else "refused")
        return seq

    async def complete(self, seq: int, **fields: Any) -> None:
        await self.inner.complete(seq, **fields)
        self._count(fields)
        await self._tool_finished(seq, "error" if fields.get("error") else "ok")

    def _count(self, fields: dict[str, Any]) -> None:
        tokens_in, tokens_out = int(fields.get("tokens_in", 0)), int(fields.get("tokens_out", 0))
        cost = float(fields.get("cost", 0.0))
        if not (tokens_in or tokens_out or cost):
            return
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out
        self.cost += cost
        if self.scope is not None and self.scope.usage is not None:
            self.scope.usage(tokens_in, tokens_out, cost)

    async def event(self, type: str, data: dict[str, Any]) -> None:
        await self.inner.event(type, data)
        if self.scope is not None:
            await emit(
                self.scope, {"type": type, "task_id": self.task_id, "depth": self.depth, **data}
            )

"""A request-scoped tool loop: one employee answering one OpenAI chat request, with no run row.

:func:`chat_complete` runs the employee's :class:`~runtime.loop.ToolLoopInvoker` over an
in-memory journal (:class:`_ChatJournal`): the prompt is the employee's system prompt followed
by the client's messages, server-side tools run under the harness's tool plan as in a run, a
call the plan gates for a human is refused (the model reads why; nothing runs), and a call of
one of the client's own tools ends the loop: it is handed back as OpenAI ``tool_calls``. The
client's ``temperature``, ``max_tokens``, ``response_format`` and ``tool_choice`` reach every
model request (``tool_choice`` other than ``"none"`` only the first). A sink gets the agent's
progress (tool started / finished, compaction, warnings) as it happens and, when the turn is
streamed (``ChatTurn.stream``), the model's released text and reasoning as they arrive.
Cancelling the task cancels the model call and the tools at once. See docs/tool-loop.md,
"Request-scoped loops".
"""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar

from runtime.dispatch import Toolset
from runtime.invocation import (
    InvocationOutcome,
    InvocationRequest,
    LoopRole,
    OutcomeKind,
    RecordedCall,
    RetryLater,
    RunHalted,
    StepRecord,
    ToolCallRefused,
    ask_refusal,
)
from runtime.loop import ToolLoopInvoker
from runtime.model_failures import ModelTemporarilyUnavailable
from runtime.policy import without_workdir_tools
from runtime.streaming import TextCallback
from runtime.tools.scope import invocation_scope
from runtime.types import ChatRequest, ChatResponse, ModelClient

T = TypeVar("T")


@dataclass(frozen=True)
class ChatEvent:
    """One thing a streamed answer reports: a ``content`` or ``reasoning`` delta, or the
    agent's progress (``agent``: ``data["type"]`` is ``tool_started``, ``tool_finished``,
    ``compaction`` or ``warning``; sub-agent events carry ``task_id`` and ``depth``)."""

    kind: Literal["content", "reasoning", "agent"]
    text: str = ""
    data: dict[str, Any] = field(default_factory=dict)


ChatSink = Callable[[ChatEvent], Awaitable[None] | None]


@dataclass(frozen=True)
class ChatTurn:
    """One chat request as the gateway validated it."""

    messages: tuple[dict[str, Any], ...]
    #: OpenAI ``tools`` entries the client runs itself.
    client_tools: tuple[dict[str, Any], ...] = ()
    tool_choice: Any = None
    temperature: float | None = None
    max_tokens: int | None = None
    response_format: dict[str, Any] | None = None
    stream: bool = False
    #: The caller (its username), the person the chat is for.
    user: str = ""
    #: The prompt blocks read with the request's preparation (``InvocationRequest.prompt_blocks``).
    prompt_blocks: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ChatResult:
    """The answer: its text, or the client-tool calls it ends with, and what it used."""

    content: str
    reasoning_content: str
    #: Client-tool calls in OpenAI shape (``finish_reason`` ``"tool_calls"``).
    tool_calls: tuple[dict[str, Any], ...]
    finish_reason: str  # "stop" | "length" | "tool_calls"
    prompt_tokens: int
    completion_tokens: int
    model_steps: int
    #: A partial failure: ``content`` is the usable text produced before it; this says what failed.
    error: str = ""
    #: What the model calls cost at their endpoints' prices (sub-agents' included).
    cost: float = 0.0


class ChatFailed(Exception):
    """The request failed before any usable text: ``code`` and HTTP ``status`` for the
    OpenAI error shape; ``retry_after`` (seconds) when the client may try again then."""

    def __init__(
        self, message: str, code: str, status: int, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.message, self.code, self.status = message, code, status
        self.retry_after = retry_after


def _emitter(sink: ChatSink | None) -> Callable[[ChatEvent], Awaitable[None]]:
    async def emit(event: ChatEvent) -> None:
        if sink is None:
            return
        result = sink(event)
        if inspect.isawaitable(result):
            await result

    return emit


# --- the in-memory journal ---------------------------------------------------------------------

_WARNINGS = {
    "tool.denied": "tool {tool} is not permitted here; the call was refused",
    "tool.duplicate": "a repeated call of {tool} with the same arguments was not run",
    "tool.finalize": "{tool} was called too often in a row; the loop is finishing",
    "tool.not_executed": "{tool} was not run: the loop is finishing",
    "tool.repetition_warning": "{tool} was called many times in a row",
}


def gate_refusal(name: str, reason: str) -> str:
    """What the model reads for a call the tool plan gates for a human."""
    because = f" ({reason})" if reason else ""
    return (
        f"Error: tool {name!r} needs a human approval{because}, which this endpoint cannot ask "
        "for; not run. Continue without it, or tell the user it needs an approved run."
    )


class _ChatJournal:
    """A :class:`~runtime.invocation.StepJournal` in memory for one chat request: nothing is
    persisted, no budget admits or halts, a gate is refused; tool steps and events become
    agent events, model steps are kept for the answer and the usage."""

    def __init__(self, run_id: uuid.UUID, emit: Callable[[ChatEvent], Awaitable[None]]) -> None:
        self.run_id = run_id
        self.emit = emit
        self.seq = 0
        #: The ``response`` of every model step, in order.
        self.model_steps: list[dict[str, Any]] = []
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cost = 0.0
        self._running: dict[int, tuple[str, str, float]] = {}

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    async def _started(self, seq: int, name: str, request: dict[str, Any]) -> None:
        call_id = str(request.get("call_id") or "")
        self._running[seq] = (call_id, name, time.monotonic())
        await self.emit(_agent("tool_started", call_id=call_id, name=name))

    async def _finished(self, seq: int, outcome: str) -> None:
        call_id, name, started = self._running.pop(seq, ("", "", time.monotonic()))
        duration = int((time.monotonic() - started) * 1000)
        await self.emit(
            _agent(
                "tool_finished", call_id=call_id, name=name, duration_ms=duration, outcome=outcome
            )
        )

    async def steps(self) -> list[StepRecord]:
        return []

    async def resume_point(self) -> tuple[str | None, list[StepRecord]]:
        return None, await self.steps()

    async def save_checkpoint(self, upto_seq: int, state: str) -> None:
        """Nothing resumes from this journal: no checkpoint is kept."""

    async def begin(
        self, *, kind: str, name: str, request: dict[str, Any], idempotency_key: str = ""
    ) -> int:
        seq = self._next()
        if kind == "tool":
            await self._started(seq, name, request)
        return seq

    async def complete(
        self,
        seq: int,
        *,
        response: Any,
        error: str = "",
        tokens_in: int = 0,
        tokens_out: int = 0,
        cost: float = 0.0,
    ) -> None:
        if seq in self._running:
            await self._finished(seq, "error" if error else "ok")

    async def record(
        self,
        *,
        kind: str,
        name: str,
        request: dict[str, Any],
        response: Any,
        error: str = "",
        tokens_in: int = 0,
        tokens_out: int = 0,
        cost: float = 0.0,
        duration_ms: int | None = None,
    ) -> int:
        seq = self._next()
        if kind == "model":
            self.model_steps.append(dict(response) if isinstance(response, dict) else {})
            self.prompt_tokens += tokens_in
            self.completion_tokens += tokens_out
            self.cost += cost
        elif kind == "tool":  # a call answered without running (invalid, denied, skipped)
            await self._started(seq, name, request)
            await self._finished(seq, "error" if error else "refused")
        return seq

    def runs_first(self, name: str, request: dict[str, Any]) -> bool:
        return False  # every call is begun first, so its tool_started precedes it

    async def record_call(
        self,
        *,
        name: str,
        request: dict[str, Any],
        idempotency_key: str,
        response: Any,
        error: str = "",
        started_at: Any = None,
    ) -> RecordedCall:
        seq = self._next()
        await self._started(seq, name, request)
        await self._finished(seq, "error" if error else "ok")
        return RecordedCall(seq)

    async def gate(
        self, *, name: str, request: dict[str, Any], idempotency_key: str, reason: str
    ) -> int:
        seq = self._next()
        await self._started(seq, name, request)
        await self._finished(seq, "refused")
        raise ToolCallRefused(gate_refusal(name, reason), seq=seq)

    async def ask(self, seq: int, *, question: str) -> None:
        raise ToolCallRefused(ask_refusal(question), seq=seq)

    async def event(self, type: str, data: dict[str, Any]) -> None:
        await self.emit(ChatEvent("agent", data=agent_data({"type": type, **data})))

    def idempotency_key(self, step_seq: int, call_index: int = 0) -> str:
        return f"{self.run_id}:{step_seq}:{call_index}"

    async def admit_model_call(self) -> None:
        return None  # no run budget: the gateway limits requests

    async def authorize(self, seq: int, name: str, arguments: dict[str, Any]) -> str:
        return "This endpoint takes no approvals; the call was not run."

    def tool_notice(self, seq: int) -> str:
        return ""

    async def db_call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(fn, *args, **kwargs)

    def usable_text(self) -> str:
        """The text the model steps so far produced, for a partial failure."""
        texts = [_content(step) for step in self.model_steps]
        return "\n\n".join(text for text in texts if text.strip())

    def reasoning(self) -> str:
        texts = [str(step.get("reasoning_content") or "") for step in self.model_steps]
        return "\n\n".join(text for text in texts if text.strip())


def agent_data(event: dict[str, Any]) -> dict[str, Any]:
    """A journal event (``{"type": "context.compacted" | "tool.<what>", ...}``) as agent data:
    ``compaction``, or a ``warning`` with a ``message``; agent event types pass unchanged."""
    kind = str(event.get("type") or "")
    if kind == "context.compacted":
        return {**event, "type": "compaction"}
    if "." not in kind:
        return event
    template = _WARNINGS.get(kind, kind.replace(".", " "))
    message = template.format(tool=repr(event.get("tool") or "a tool"))
    return {**event, "type": "warning", "message": message, "event": kind}


def _agent(type: str, **data: Any) -> ChatEvent:
    return ChatEvent("agent", data={"type": type, **data})


def _content(step: dict[str, Any]) -> str:
    content = (step.get("message") or {}).get("content")
    return content if isinstance(content, str) else ""


# --- the model client of one turn -------------------------------------------------------------


def _response_format(spec: dict[str, Any] | None) -> dict[str, Any]:
    """The client's ``response_format`` as :class:`ChatRequest` fields ({} for none / text)."""
    kind = (spec or {}).get("type")
    if kind == "json_object":
        return {"response_format": "json_object"}
    if kind == "json_schema":
        schema = (spec or {}).get("json_schema")
        return {"response_format": "json_schema", "json_schema": schema or {}}
    return {}


class _TurnClient:
    """The employee's model client for one turn: the client's parameters on every request, and
    a streamed answer's text and reasoning to the sink."""

    def __init__(
        self,
        inner: ModelClient,
        turn: ChatTurn,
        emit: Callable[[ChatEvent], Awaitable[None]],
        *,
        streaming: bool,
    ) -> None:
        self.inner = inner
        self.turn = turn
        self.emit = emit
        self.streaming = streaming
        self.calls = 0
        #: Text released to the sink in the model call in flight (for a partial failure).
        self.pending: list[str] = []
        parameters = inspect.signature(inner.complete).parameters
        anything = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        self.takes_text = anything or "on_text" in parameters
        self.takes_reasoning = anything or "on_reasoning" in parameters

    def request(self, request: ChatRequest) -> ChatRequest:
        turn = self.turn
        changes: dict[str, Any] = _response_format(turn.response_format)
        if turn.temperature is not None:
            changes["temperature"] = turn.temperature
        if turn.max_tokens:
            changes["max_tokens"] = turn.max_tokens
        # "none" holds for the whole turn; a forced or required tool only for its first step,
        # or the model could never answer.
        if turn.tool_choice == "none" or (turn.tool_choice is not None and self.calls == 1):
            changes["tool_choice"] = turn.tool_choice
        if self.streaming:
            changes["stream"] = True
        return replace(request, **changes)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.calls += 1
        request = self.request(request)
        self.pending = []
        if not self.streaming or not self.takes_text:
            return await self.inner.complete(request)
        options: dict[str, TextCallback] = {"on_text": self._text}
        if self.takes_reasoning:
            options["on_reasoning"] = self._reasoning
        response: ChatResponse = await self.inner.complete(request, **options)
        if response.tool_calls and self.pending:
            # Text went out before tool calls (a preamble too long to hold): keep it apart
            # from what the next step says.
            await self.emit(ChatEvent("content", "\n\n"))
        self.pending = []
        return response

    async def _text(self, delta: str) -> None:
        self.pending.append(delta)
        await self.emit(ChatEvent("content", delta))

    async def _reasoning(self, delta: str) -> None:
        await self.emit(ChatEvent("reasoning", delta))


# --- the request --------------------------------------------------------------------------------


def _client_tool_names(turn: ChatTurn, offered: dict[str, Any]) -> list[str]:
    names = []
    for entry in turn.client_tools:
        function = entry.get("function") if isinstance(entry, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name or entry.get("type") != "function":
            raise ChatFailed(
                "Each entry of tools must be a function tool with a name.", "invalid_tools", 400
            )
        if name in offered:
            raise ChatFailed(
                f"The tool name {name!r} is taken by one of the employee's own tools; rename "
                "your tool.",
                "tool_name_conflict",
                400,
            )
        names.append(name)
    if len(set(names)) != len(names):
        raise ChatFailed("Two tools share a name.", "invalid_tools", 400)
    return names


async def _resolve(value: T | Awaitable[T]) -> T:
    if inspect.isawaitable(value):
        return await value
    return value


#: Outcome codes of a failed invocation → (error code, HTTP status) of the request.
_FAILURES: dict[str, tuple[str, int]] = {
    "model_unavailable": ("model_error", 502),
    "context_overflow": ("context_overflow", 400),
    "empty_answer": ("empty_answer", 502),
    "invalid_output": ("invalid_output", 502),
}


def chat_invocation(*, employee: str, harness: dict[str, Any], turn: ChatTurn) -> InvocationRequest:
    """The request-scoped invocation that answers ``turn`` as ``employee`` (its ``run_id`` is
    no run's)."""
    return InvocationRequest(
        run_id=uuid.uuid4(),
        role=LoopRole.MAKER,
        invocation="chat",
        employee_username=employee,
        goal="",
        harness=harness,
        conversation=tuple(turn.messages),
        client_tools=tuple(turn.client_tools),
        user=turn.user,
        prompt_blocks=turn.prompt_blocks,
    )


async def chat_complete(
    invoker: ToolLoopInvoker,
    *,
    employee: str,
    harness: dict[str, Any],
    turn: ChatTurn,
    sink: ChatSink | None = None,
    model_client: ModelClient | None = None,
) -> ChatResult:
    """Answer ``turn`` as ``employee`` (its invoker's prompt, tools, policy and limits, under
    the compiled ``harness`` snapshot); see the module docstring. Raises :class:`ChatFailed`
    when it fails before any usable text; cancellation propagates at once."""
    emit = _emitter(sink)
    request = chat_invocation(employee=employee, harness=harness, turn=turn)
    policy = without_workdir_tools(await _resolve(invoker.policy(request)), invoker.tools.specs())
    _client_tool_names(turn, Toolset(invoker.tools, policy).offered)
    inner: ModelClient = (
        model_client
        if model_client is not None
        else await _resolve(invoker.model_clients(employee))
    )
    client = _TurnClient(inner, turn, emit, streaming=sink is not None and turn.stream)
    journal = _ChatJournal(request.run_id, emit)
    loop = ToolLoopInvoker(
        model_clients=lambda _username: client,
        tools=invoker.tools,
        policy=lambda _request: policy,
        settings=invoker.settings,
        system_prompt=invoker.system_prompt,
        bound_tools=invoker.bound_tools,
        preset_messages=invoker.preset_messages,
        vision=invoker.vision,
        endpoint_name=invoker.endpoint_name,
        route_label=invoker.route_label,
    )

    def add_usage(tokens_in: int, tokens_out: int, cost: float) -> None:
        journal.prompt_tokens += tokens_in  # a sub-agent's model steps count for the request
        journal.completion_tokens += tokens_out
        journal.cost += cost

    async def sub_agent(event: dict[str, Any]) -> None:  # tagged with task_id and depth
        await emit(ChatEvent("agent", data=agent_data(event)))

    events = sub_agent if sink is not None else None
    try:
        with invocation_scope(journal, events=events, usage=add_usage):
            outcome = await loop.invoke(request, journal)
    except RetryLater as exc:  # a run would park and retry; a request answers now
        if isinstance(exc, ModelTemporarilyUnavailable) and exc.rate_limited:
            # The model's rate limit, relayed: clients back off on a 429 and its Retry-After.
            return _partial(
                journal, client, str(exc), "rate_limit_exceeded", 429, exc.delay_seconds
            )
        return _partial(journal, client, str(exc), "model_unavailable", 503)
    except RunHalted as exc:
        return _partial(journal, client, exc.reason, exc.code or "halted", 400)
    return _result(outcome, journal, client)


def _result(outcome: InvocationOutcome, journal: _ChatJournal, client: _TurnClient) -> ChatResult:
    last = journal.model_steps[-1] if journal.model_steps else {}
    if outcome.kind is OutcomeKind.COMPLETED:
        handed = outcome.output.get("client_tool_calls")
        if handed:
            text = str(outcome.output.get("text") or "")
            return _answer(journal, text, "tool_calls", tuple(handed))
        finish = "length" if last.get("finish_reason") == "length" else "stop"
        return _answer(journal, _content(last), finish)
    if outcome.kind is OutcomeKind.NEEDS_APPROVAL:  # not reached: the journal refuses gates
        return _partial(journal, client, "a tool call needs approval", "approval_required", 403)
    code = outcome.code or "failed"
    if code == "empty_answer" and last.get("finish_reason") == "length":
        # Cut at max_tokens before any text (a reasoning model): what OpenAI answers too.
        return _answer(journal, journal.usable_text(), "length")
    mapped, status = _FAILURES.get(code, (code.split(":")[0], 400))
    return _partial(journal, client, outcome.reason or code, mapped, status)


def _partial(
    journal: _ChatJournal,
    client: _TurnClient,
    reason: str,
    code: str,
    status: int,
    retry_after: float | None = None,
) -> ChatResult:
    """The usable text produced before a failure, with the failure; ChatFailed when none."""
    text = "".join(client.pending)
    usable = "\n\n".join(t for t in (journal.usable_text(), text) if t.strip())
    if not usable:
        raise ChatFailed(reason, code, status, retry_after)
    return _answer(journal, usable, "stop", error=f"{code}: {reason}")


def _answer(
    journal: _ChatJournal,
    content: str,
    finish_reason: str,
    tool_calls: tuple[dict[str, Any], ...] = (),
    error: str = "",
) -> ChatResult:
    return ChatResult(
        content=content,
        reasoning_content=journal.reasoning(),
        tool_calls=tool_calls,
        finish_reason=finish_reason,
        prompt_tokens=journal.prompt_tokens,
        completion_tokens=journal.completion_tokens,
        model_steps=len(journal.model_steps),
        error=error,
        cost=journal.cost,
    )

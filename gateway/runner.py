"""One ``/v1/chat/completions`` request: who calls which employee, the employee's tool loop
under its compiled harness (:func:`runtime.chat.chat_complete`), and the OpenAI-shaped answer:
a ``chat.completion`` object, or ``chat.completion.chunk`` SSE events ending in ``[DONE]``.

A streamed request's chat runs as its own task; when the client disconnects, Django cancels the
response iterator and the iterator cancels that task (model call, tools, sub-agents) at once.
The request's record is written once, after the task ended, on a task of its own (a cancelled
iterator cannot await).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from django.utils import timezone

from gateway import services, tracing
from gateway.access import PROFILES, Prepared
from gateway.errors import OpenAIError
from gateway.models import new_completion_id
from gateway.token_quotas import token_quota_spent, token_usage_add
from gateway.validation import CompletionRequest
from orchestrator.agents.quotas import QuotaSpent, quota_charge, quota_spent
from orchestrator.agents.subagent_host import agent_tools_register
from orchestrator.agents.wiring import (
    employee_tool_loop,
    employee_tool_registry,
)
from orchestrator.dbpool import db_call
from runtime.chat import ChatEvent, ChatFailed, ChatResult, ChatTurn, chat_complete
from runtime.guardrails import (
    GuardrailReport,
    StreamGate,
    check_input,
    check_output,
)
from runtime.model_client import STREAM_ACCEPTED
from runtime.model_pool import pool_http_connections
from runtime.scrub import scrub
from runtime.tools import ToolRegistry
from runtime.tools.bash import network_access

logger = logging.getLogger(__name__)
DONE = "data: [DONE]\n\n"
#: Record writes in flight (a task nobody holds may be collected before it runs).
_PENDING: set[asyncio.Task[None]] = set()
#: The event loops whose model calls reuse pooled HTTP clients (keep-alive connections).
POOLED_LOOPS: set[asyncio.AbstractEventLoop] = set()


@functools.cache
def _registry() -> ToolRegistry:
    """The employee tool registry of this process, with the sub-agent dispatch and todo tools."""
    return agent_tools_register(employee_tool_registry(), PROFILES)


def records_pending() -> int:
    """How many request records are still to be written (a test waits for none before it
    closes the database threads)."""
    return len(_PENDING)


def _pooled() -> None:
    loop = asyncio.get_running_loop()
    if loop not in POOLED_LOOPS:
        pool_http_connections(loop)
        POOLED_LOOPS.add(loop)


def _turn(request: CompletionRequest, prepared: Prepared) -> ChatTurn:
    return ChatTurn(
        user=prepared.user.username,
        prompt_blocks=prepared.prompt_blocks,
        messages=request.messages,
        client_tools=request.tools,
        tool_choice=request.tool_choice,
        temperature=request.temperature,
        max_tokens=request.max_tokens,
        response_format=request.response_format,
        stream=request.stream,
    )


def _failure(exc: ChatFailed) -> OpenAIError:
    headers = {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    return OpenAIError(exc.status, exc.message, code=exc.code or None, headers=headers)


class Chat:
    """One request's chat: the run, the tally of what it did, its record."""

    def __init__(
        self, request: CompletionRequest, prepared: Prepared, trace: tracing.ChatTrace
    ) -> None:
        self.request = request
        self.prepared = prepared
        self.trace = trace
        self.started = time.monotonic()
        self.created = int(time.time())
        self.tally = services.CompletionTally(
            id=new_completion_id(),
            employee_username=prepared.profile.username,
            user_id=prepared.user.pk,
            created_at=timezone.now(),
            stream=request.stream,
            end_user=request.end_user,
            metadata=request.metadata,
            trace_id=trace.trace_id,
        )
        self.agent_events: list[dict[str, Any]] = []
        #: What the chat's model calls cost (the endpoints' prices), for the quotas.
        self.cost = 0.0

    # -- running ---------------------------------------------------------------------------

    def observe(self, event: ChatEvent) -> None:
        """Keep the agent events and count the server-side tool calls."""
        if event.kind == "agent":
            self.agent_events.append(dict(event.data))
            if event.data.get("type") == "tool_started":
                self.tally.tool_calls += 1

    async def run(self, sink: Any = None) -> ChatResult:
        """Run the chat; ``sink`` gets its events. Answers and events are scrubbed of the API
        keys of the employee's endpoint chain."""
        prepared = self.prepared
        secrets = prepared.profile.secrets
        invoker = employee_tool_loop(
            prepared.profile, _registry(), route=prepared.profile.route(role="chat")
        )
        _pooled()

        async def observed(event: ChatEvent) -> None:
            if secrets:
                event = replace(
                    event, text=scrub(event.text, secrets), data=scrub(event.data, secrets)
                )
            self.observe(event)
            if sink is not None:
                await sink(event)

        with network_access(prepared.harness.get("settings")):
            result = await chat_complete(
                invoker,
                employee=prepared.profile.username,
                harness=prepared.harness,
                turn=_turn(self.request, prepared),
                sink=observed,
            )
        if secrets:
            result = replace(
                result,
                content=scrub(result.content, secrets),
                reasoning_content=scrub(result.reasoning_content, secrets),
                tool_calls=scrub(result.tool_calls, secrets),
                error=scrub(result.error, secrets),
            )
        self.finished(result)
        return result

    def finished(self, result: ChatResult) -> None:
        tally = self.tally
        tally.finish_reason = result.finish_reason
        tally.prompt_tokens = result.prompt_tokens
        tally.completion_tokens = result.completion_tokens
        tally.model_steps = result.model_steps
        self.cost = result.cost
        if result.error:  # usable text, then a failure: answered, and recorded as an error
            tally.status = "error"
            tally.error = result.error

    def failed(self, status: str, error: str) -> None:
        self.tally.status = status
        self.tally.error = error

    # -- answers ---------------------------------------------------------------------------

    def usage(self) -> dict[str, int]:
        prompt, completion = self.tally.prompt_tokens, self.tally.completion_tokens
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def completion(self, result: ChatResult) -> dict[str, Any]:
        """The ``chat.completion`` object of a finished chat."""
        message: dict[str, Any] = {"role": "assistant", "content": result.content or None}
        if result.tool_calls:
            message["tool_calls"] = list(result.tool_calls)
        if result.reasoning_content:
            message["reasoning_content"] = result.reasoning_content
        body: dict[str, Any] = {
            "id": self.tally.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.tally.employee_username,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": result.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": self.usage(),
        }
        if self.agent_events:
            body["agent_metadata"] = self.agent_events
        if self.tally.guardrail_decisions:
            body["guardrail_metadata"] = self.tally.guardrail_decisions
        if result.error:
            body["warning"] = result.error
        return body

    def chunk(self, delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> str:
        """One ``chat.completion.chunk`` SSE event (``delta`` None: no choices)."""
        body: dict[str, Any] = {
            "id": self.tally.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.tally.employee_username,
            "choices": []
            if delta is None
            else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
            **extra,
        }
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    def event_chunk(self, event: ChatEvent) -> str:
        if event.kind == "content":
            return self.chunk({"content": event.text})
        if event.kind == "reasoning":
            return self.chunk({"reasoning_content": event.text})
        return self.chunk({}, agent_metadata=event.data)

    # -- the record ------------------------------------------------------------------------

    def record_soon(self, task: asyncio.Task[Any] | None = None) -> None:
        """Write the record on a task of its own, after ``task`` (the chat) has ended."""
        recorder = asyncio.get_running_loop().create_task(self._record(task))
        _PENDING.add(recorder)
        recorder.add_done_callback(_PENDING.discard)

    async def _record(self, task: asyncio.Task[Any] | None) -> None:
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=10)
        duration = int((time.monotonic() - self.started) * 1000)
        try:
            await db_call(services.completion_record, self.tally, duration)
        except Exception:
            logger.exception("chat completion record %s not written", self.tally.id)
        quota = self.prepared.profile.quota
        tokens, cost = self.tally.prompt_tokens + self.tally.completion_tokens, self.cost
        if quota is not None and quota.binds and (tokens or cost):
            try:
                await db_call(
                    functools.partial(quota_charge, quota.username, tokens=tokens, cost=cost)
                )
            except Exception:
                logger.exception("chat completion %s: quota usage not added", self.tally.id)
        token = self.prepared.token_quota
        if token is not None and (tokens or cost):
            try:
                add = functools.partial(token_usage_add, token.token_id, tokens=tokens, cost=cost)
                await db_call(add)
            except Exception:
                logger.exception("chat completion %s: token usage not added", self.tally.id)
        try:
            tracing.chat_span_export(self.trace, self.tally, duration)
        except Exception:
            logger.exception("chat completion span %s not exported", self.tally.id)


# --- Quotas and guardrails -------------------------------------------------------------------


async def guard_quota(chat: Chat) -> None:
    """A 429 ``quota_exceeded`` error with ``Retry-After`` (to the next UTC midnight) when the
    calling token's daily quota (read with the request, no query) or the employee's is used up
    (the request is recorded as blocked)."""
    token = chat.prepared.token_quota
    spent: QuotaSpent | None = None
    if token is not None:
        spent = token_quota_spent(token)
    quota = chat.prepared.profile.quota
    if spent is None and quota is not None and quota.binds:
        spent = await db_call(functools.partial(quota_spent, quota))
    if spent is None:
        return
    chat.failed("blocked", spent.message())
    chat.record_soon()
    raise OpenAIError(
        429,
        f"The daily quota is used up: {spent.message()}.",
        code="quota_exceeded",
        headers={"Retry-After": str(spent.retry_after_seconds())},
    )


def _recorded(chat: Chat, report: GuardrailReport) -> dict[str, Any]:
    decided = report.as_dict()
    if report.decisions:
        chat.tally.guardrail_decisions.append(decided)
    return decided


async def guard_input(chat: Chat) -> dict[str, Any] | None:
    """The input rules over the client's messages: their report (None without input rules),
    or a 400 ``content_filter`` error when one blocks (the request is recorded as blocked)."""
    config = chat.prepared.guardrails
    if not config.input:
        return None
    report = await check_input(config, chat.request.messages)
    decided = _recorded(chat, report)
    blocked = report.blocked
    if blocked is not None:
        chat.failed("blocked", f"input guardrail {blocked.rule}: {blocked.reason}")
        chat.record_soon()
        error = OpenAIError(
            400,
            f"The input was blocked by the guardrail {blocked.rule!r}: {blocked.reason}",
            code="content_filter",
            param="messages",
        )
        error.extra = {"guardrail_metadata": decided}
        raise error
    return decided


async def guard_output(chat: Chat, result: ChatResult) -> ChatResult:
    """The output rules over a whole answer: the answer, or none (``content_filter``). The rules
    check ``content`` only, so with any of them ``reasoning_content`` is withheld."""
    config = chat.prepared.guardrails
    if not config.output:
        return result
    report = await check_output(config, result.content)
    _recorded(chat, report)
    blocked = report.blocked
    if blocked is None:
        return replace(result, reasoning_content="")
    chat.failed("blocked", f"output guardrail {blocked.rule}: {blocked.reason}")
    chat.tally.finish_reason = "content_filter"
    return replace(result, content="", reasoning_content="", finish_reason="content_filter")


# --- The two ways to answer -------------------------------------------------------------------


async def complete(chat: Chat) -> dict[str, Any]:
    """A non-streamed answer, or OpenAIError; the record is written either way."""
    await guard_quota(chat)
    await guard_input(chat)
    try:
        result = await guard_output(chat, await chat.run())
    except ChatFailed as exc:
        error = _failure(exc)
        chat.failed(_status_of(exc), error.message)
        raise error from exc
    except asyncio.CancelledError:
        chat.failed("error", "the client disconnected")
        raise
    except Exception as exc:
        logger.exception("chat completion %s failed", chat.tally.id)
        chat.failed("error", f"internal error: {type(exc).__name__}")
        raise OpenAIError(500, "The server failed; see its logs.", code="internal_error") from exc
    finally:
        chat.record_soon()
    return chat.completion(result)


def _partial_error(error: str) -> OpenAIError:
    """The error of a chat that failed after usable text (``"<code>: <reason>"``)."""
    code, _, reason = error.partition(": ")
    return OpenAIError(502, reason or code, code=code if reason else "failed")


def _status_of(exc: ChatFailed) -> str:
    code = str(getattr(exc, "code", "") or "")
    return "blocked" if "guardrail" in code or "blocked" in code else "error"


_END = object()
#: Queued once, when the employee's model first accepted a streamed call.
_ACCEPTED = object()
#: How long a streamed response may wait for Django to start sending it.
UNSENT_SECONDS = 30.0


async def stream_open(chat: Chat) -> AsyncIterator[str]:
    """Check the input, start the chat and wait until its model accepted the streamed call (or
    its first event): a chat refused or failed before that is an OpenAIError (an HTTP status,
    as for a non-streamed request); otherwise the SSE events, a later failure among them (the
    response's head then goes out while the model still thinks, off the first content's path)."""
    await guard_quota(chat)
    guarded = await guard_input(chat)
    queue: asyncio.Queue[Any] = asyncio.Queue()
    accepted = False

    async def sink(event: ChatEvent) -> None:
        queue.put_nowait(event)

    def on_accepted() -> None:
        nonlocal accepted
        if not accepted:
            accepted = True
            queue.put_nowait(_ACCEPTED)

    context = contextvars.copy_context()
    context.run(STREAM_ACCEPTED.set, on_accepted)
    task = asyncio.get_running_loop().create_task(chat.run(sink), context=context)
    task.add_done_callback(lambda _t: queue.put_nowait(_END))
    try:
        first = await queue.get()
    except asyncio.CancelledError:
        task.cancel()
        chat.failed("error", "the client disconnected")
        chat.record_soon(task)
        raise
    if first is _END and task.exception() is not None:
        exc = task.exception()
        if isinstance(exc, ChatFailed):
            error = _failure(exc)
            chat.failed(_status_of(exc), error.message)
        else:
            logger.error("chat completion %s failed", chat.tally.id, exc_info=exc)
            chat.failed("error", f"internal error: {type(exc).__name__}")
            error = OpenAIError(500, "The server failed; see its logs.", code="internal_error")
        chat.record_soon(task)
        raise error
    stream = _Stream(chat, task, queue, guarded)
    # A response Django never starts to send (the client left in between) would leave the chat
    # running unseen: cancel it, and record why.
    asyncio.get_running_loop().call_later(UNSENT_SECONDS, stream.abandon_unsent)
    return stream.events(first)


class _Stream:
    """The SSE events of one streamed answer, its content passed through the output gate."""

    def __init__(
        self,
        chat: Chat,
        task: asyncio.Task[ChatResult],
        queue: asyncio.Queue[Any],
        guarded: dict[str, Any] | None,
    ) -> None:
        self.chat = chat
        self.task = task
        self.queue = queue
        self.guarded = guarded
        config = chat.prepared.guardrails
        self.gate = StreamGate(config) if config.output else None
        self.started = False

    def abandon_unsent(self) -> None:
        """Cancel the chat of a response Django never started to send, and record it."""
        if self.started:
            return
        self.task.cancel()
        self.chat.failed("error", "the response was never sent (the client left)")
        self.chat.record_soon(self.task)

    def _content(self, text: str) -> str | None:
        released = self.gate.feed(text) if self.gate is not None else text
        return self.chat.chunk({"content": released}) if released else None

    async def _finish(self, result: ChatResult) -> list[str]:
        chat = self.chat
        out: list[str] = []
        finish_reason = result.finish_reason
        if self.gate is not None:
            rest = await self.gate.finish()
            if rest:
                out.append(chat.chunk({"content": rest}))
            out.append(chat.chunk({}, guardrail_metadata=_recorded(chat, self.gate.report)))
            if self.gate.blocked is not None:
                blocked = self.gate.blocked
                chat.failed("blocked", f"output guardrail {blocked.rule}: {blocked.reason}")
                finish_reason = chat.tally.finish_reason = "content_filter"
        if result.error and finish_reason != "content_filter":
            # A failure after usable text: the text went out; the stream ends with the error.
            out.append(f"data: {json.dumps(_partial_error(result.error).body())}\n\n")
            return out
        delta: dict[str, Any] = {}
        if result.tool_calls and finish_reason != "content_filter":
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(result.tool_calls)]
        out.append(chat.chunk(delta, finish_reason))
        if chat.request.include_usage:
            out.append(chat.chunk(None, usage=chat.usage()))
        return out

    async def events(self, first: Any) -> AsyncIterator[str]:
        """The role chunk, the input guardrails' report, one chunk per chat event, the finish
        chunk, the usage chunk (``stream_options.include_usage``), a final error event on
        failure, and ``data: [DONE]``; a disconnect cancels the chat task."""
        chat, task = self.chat, self.task
        self.started = True
        try:
            yield chat.chunk({"role": "assistant", "content": ""})
            if self.guarded is not None:
                yield chat.chunk({}, guardrail_metadata=self.guarded)
            item = first
            while item is not _END:
                if item is _ACCEPTED:
                    item = await self.queue.get()
                    continue
                chunk = self._content(item.text) if item.kind == "content" else None
                if item.kind != "content" and not (item.kind == "reasoning" and self.gate):
                    chunk = chat.event_chunk(item)  # unchecked reasoning stays behind a gate
                if chunk is not None:
                    yield chunk
                item = await self.queue.get()
            for chunk in await self._finish(task.result()):
                yield chunk
        except (asyncio.CancelledError, GeneratorExit):
            task.cancel()
            chat.failed("error", "the client disconnected")
            raise
        except ChatFailed as exc:
            error = _failure(exc)
            chat.failed(_status_of(exc), error.message)
            yield f"data: {json.dumps(error.body())}\n\n"
        except Exception as exc:
            logger.exception("chat completion %s failed mid-stream", chat.tally.id)
            chat.failed("error", f"internal error: {type(exc).__name__}")
            error = OpenAIError(500, "The server failed mid-stream; see its logs.")
            yield f"data: {json.dumps(error.body())}\n\n"
        finally:
            if not task.done():
                task.cancel()
            chat.record_soon(task)
        yield DONE

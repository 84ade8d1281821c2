"""Carrying out the tool calls of one model step, durably.

Every call gets exactly one persisted tool step before the next model step starts:

* a call that runs is ``begin``-ed (with its idempotency key) *before* the tool is called and
  ``complete``-d after it, so a crash in between leaves a ``started`` step that the next
  attempt re-issues with the same key;
* a gated call is persisted with ``gate`` and does not run; the invocation parks once the
  step's other calls are handled, and resumes when a human has decided;
* a call answered without running (unknown, malformed, denied, duplicate, not executed) is
  ``record``-ed with the answer the model gets.

Calls run in a bounded pool (``tool_concurrency``), each under its own timeout; results come
back in the order the model made the calls, whatever order they finish in.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

from runtime.dispatch import ERRORS, Disposition, PlannedCall, StepPlan, Toolset
from runtime.history import APPROVED, FINISHED, GATED, STARTED, Answer, Log, ModelEntry
from runtime.history import result_images as recorded_images
from runtime.history import result_text as recorded_text
from runtime.invocation import LeaseLost, StepJournal, StepRecord, ToolCallRefused
from runtime.observers import runtime_observer
from runtime.tool_images import ImageEndpoint, bounded_images, not_shown_note
from runtime.tools.base import Invocation, Tool, ToolContext, ToolError, ToolResult
from runtime.truncation import truncate_output
from runtime.types import Effect
from runtime.validation import Invalid, validate_arguments

T = TypeVar("T")


@dataclass(frozen=True)
class ExecutionLimits:
    concurrency: int
    timeout_seconds: float
    max_output_chars: int


@dataclass(frozen=True)
class CallResult:
    content: str
    error: str = ""
    files_written: tuple[str, ...] = ()
    original_length: int | None = None
    #: The question of a call that needs a person's answer (``ToolResult.input_request``).
    input_request: str = ""
    #: The result's images (bounded ``data:`` URLs), persisted so a resume shows them again.
    images: tuple[str, ...] = ()

    def response(self) -> dict[str, Any]:
        response: dict[str, Any] = {"content": self.content}
        if self.files_written:
            response["files_written"] = list(self.files_written)
        if self.images:
            response["images"] = list(self.images)
        if self.original_length is not None:
            response["truncated_from"] = self.original_length
        return response


@dataclass(frozen=True)
class Settlement:
    #: call index → the tool message content the model gets.
    results: dict[int, str]
    #: Calls waiting for a human: ``{"seq", "tool", "arguments", "reason"}``, with ``"kind":
    #: "input"`` for a call that asked a question (``reason`` is the question).
    gated: list[dict[str, Any]]
    #: call index → the images of its result, for the calls whose result has any.
    images: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def answer(self, index: int) -> Answer:
        return self.results[index], self.images.get(index, ())


@dataclass(frozen=True)
class Asked:
    """A call that ran and now waits for a person's answer: its entry of ``Settlement.gated``."""

    gated: dict[str, Any]


#: A call that ran: its index and its result, or the question it waits on.
Ran = tuple[int, CallResult | Asked]


def _failure(message: str, max_chars: int) -> CallResult:
    return CallResult(content=truncate_output(f"Error: {message}", max_chars).text, error=message)


def _shaped(result: ToolResult | str, max_chars: int) -> CallResult:
    if not isinstance(result, ToolResult):  # adapters (MCP, skills) may hand back plain text
        result = ToolResult(str(result))
    cut = truncate_output(result.content, max_chars)
    content = f"Error: {cut.text}" if result.is_error else cut.text
    images, dropped = bounded_images(result.images)
    return CallResult(
        content="\n".join([content, *dropped]),
        error=result.content[:1000] if result.is_error else "",
        files_written=result.files_written,
        original_length=cut.original_length if cut.truncated else None,
        input_request=result.input_request[:2000],
        images=images,
    )


async def execute_tool(
    tool: Tool, arguments: dict[str, Any], context: ToolContext, limits: ExecutionLimits
) -> CallResult:
    """Run one tool under the per-tool timeout; every failure becomes an error result.

    Cancellation and a lost lease are not failures of the tool: they propagate. Each call's
    end is told to the runtime's observer (``runtime/observers.py``).
    """
    started, outcome = time.monotonic(), "cancelled"
    try:
        result = await _execute(tool, arguments, context, limits)
        outcome = "error" if result.error else "ok"
        return result
    finally:
        seconds = time.monotonic() - started
        observer = runtime_observer()
        observer.tool_call(effect=tool.spec.effect.value, outcome=outcome, seconds=seconds)


async def _execute(
    tool: Tool, arguments: dict[str, Any], context: ToolContext, limits: ExecutionLimits
) -> CallResult:
    name = tool.spec.name
    scope = asyncio.timeout(limits.timeout_seconds)
    try:
        async with scope:
            result = await tool.run(arguments, context)
    except TimeoutError:
        context.cancelled.set()
        if not scope.expired():
            return _failure(f"tool {name!r} raised a timeout of its own.", limits.max_output_chars)
        return _failure(
            f"tool {name!r} timed out after {limits.timeout_seconds:g} s and was abandoned. "
            "Try a narrower request or a different approach.",
            limits.max_output_chars,
        )
    except asyncio.CancelledError:
        context.cancelled.set()
        raise
    except LeaseLost:
        raise
    except ToolError as exc:
        return _failure(str(exc), limits.max_output_chars)
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}"[:500]
        return _failure(f"tool {name!r} failed unexpectedly ({detail}).", limits.max_output_chars)
    return _shaped(result, limits.max_output_chars)


async def run_bounded(factories: list[Callable[[], Awaitable[T]]], limit: int) -> list[T]:
    """Run the coroutines at most ``limit`` at a time; results in the order given.

    If one raises (a lost lease) or the caller is cancelled, the others are cancelled and
    awaited before the exception propagates unchanged: coroutines still waiting for a slot
    never start, running ones see the cancellation.
    """
    slots = asyncio.Semaphore(max(limit, 1))
    stopped = False

    async def bounded(factory: Callable[[], Awaitable[T]]) -> T:
        nonlocal stopped
        async with slots:
            # A sibling failed (and freed its slot): this one must not start after it.
            if stopped:
                raise asyncio.CancelledError
            try:
                return await factory()
            except BaseException:
                stopped = True
                raise

    tasks = [asyncio.ensure_future(bounded(factory)) for factory in factories]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class StepExecutor:
    """Settles the calls of model steps for one invocation."""

    def __init__(
        self,
        *,
        journal: StepJournal,
        toolset: Toolset,
        limits: ExecutionLimits,
        workdir: str | None,
        files_written: set[str],
        invocation: Invocation | None = None,
        endpoint: ImageEndpoint | None = None,
    ) -> None:
        self.journal = journal
        self.toolset = toolset
        self.limits = limits
        self.workdir = workdir
        self.files_written = files_written
        #: Who makes the calls: every call's context carries it (``ToolContext.invocation``).
        self.invocation = invocation
        #: The model endpoint: results keep their images only when it accepts images.
        self.endpoint = endpoint

    async def settle(self, entry: ModelEntry, plan: StepPlan, log: Log) -> Settlement:
        """Give every call of ``entry`` a result, acting only on calls with none persisted.

        Approved calls run only once no call of the step is still gated: the step resumes as
        a whole, after every decision on it is in.
        """
        results: dict[int, str] = {}
        images: dict[int, tuple[str, ...]] = {}
        gated: list[dict[str, Any]] = []
        runs: list[Callable[[], Awaitable[Ran]]] = []
        approved: list[Callable[[], Awaitable[Ran]]] = []
        for planned in plan.calls:
            record = log.result(entry.seq, planned.index)
            if record is not None and record.status in FINISHED:
                results[planned.index] = recorded_text(record)
                images[planned.index] = recorded_images(record)
            elif record is not None and record.status == GATED:
                gated.append(_gated(record, planned))
            elif record is not None and record.status in (STARTED, APPROVED):
                batch = approved if record.status == APPROVED else runs
                batch.append(partial(self._resume, planned, record))
            elif planned.disposition is Disposition.RUN:
                runs.append(partial(self._start, entry, planned))
            elif planned.disposition is Disposition.GATE:
                try:
                    gated.append(await self._gate(entry, planned))
                except ToolCallRefused as refused:  # run policy: persisted, never to run
                    results[planned.index] = refused.content
            else:
                results[planned.index] = await self._answer(entry, planned)
        if not gated:
            runs.extend(approved)
        if runs:  # a replayed step has none: it costs no tasks
            for index, ran in await run_bounded(runs, self.limits.concurrency):
                if isinstance(ran, Asked):
                    gated.append(ran.gated)
                else:
                    results[index], images[index] = ran.content, ran.images
        return Settlement(results, gated, {i: shown for i, shown in images.items() if shown})

    def _request(
        self, entry: ModelEntry, planned: PlannedCall, arguments: Any, tool: Tool | None = None
    ) -> dict[str, Any]:
        """The step's request; ``tool`` is the planned tool when the caller has looked it up."""
        request = {
            "model_seq": entry.seq,
            "index": planned.index,
            "call_id": planned.call.id,
            "arguments": arguments,
            "disposition": str(planned.disposition),
        }
        if tool is None and planned.tool:
            tool = self.toolset.registry.get(planned.tool)
        if tool is not None:  # the declared tier, for the call's span (docs/observability.md)
            request["effect"] = str(tool.spec.effect)
        if planned.repairs:
            request["repairs"] = list(planned.repairs)
        return request

    async def _answer(self, entry: ModelEntry, planned: PlannedCall) -> str:
        arguments = planned.arguments if planned.arguments is not None else planned.call.arguments
        error = planned.message if planned.disposition in ERRORS else ""
        content = f"Error: {planned.message}" if error else planned.message
        await self.journal.record(
            kind="tool",
            name=planned.tool or planned.call.name,
            request=self._request(entry, planned, arguments),
            response={"content": content, "disposition": str(planned.disposition)},
            error=error,
        )
        if planned.disposition is not Disposition.INVALID:
            await self.journal.event(
                f"tool.{planned.disposition}",
                {
                    "tool": planned.tool or planned.call.name,
                    "model_seq": entry.seq,
                    "index": planned.index,
                },
            )
        return content

    async def _gate(self, entry: ModelEntry, planned: PlannedCall) -> dict[str, Any]:
        reason = planned.message or "the tool plan asks for approval of this tool"
        seq = await self.journal.gate(
            name=planned.tool,
            request=self._request(entry, planned, planned.arguments),
            idempotency_key=self.journal.idempotency_key(entry.seq, planned.index),
            reason=reason,
        )
        return {"seq": seq, "tool": planned.tool, "arguments": planned.arguments, "reason": reason}

    async def _start(self, entry: ModelEntry, planned: PlannedCall) -> Ran:
        tool = self.toolset.registry.get(planned.tool)
        if (
            tool is not None
            and tool.spec.effect == Effect.READ
            and self.journal.runs_first(
                planned.tool, self._request(entry, planned, planned.arguments, tool)
            )
        ):
            return await self._run_read(entry, planned, tool)
        key = self.journal.idempotency_key(entry.seq, planned.index)
        # Persisted before the tool runs: after a crash, this started step is the only trace
        # that the effect may have happened, and it carries the key the re-issue must reuse.
        try:
            seq = await self.journal.begin(
                kind="tool",
                name=planned.tool,
                request=self._request(entry, planned, planned.arguments, tool),
                idempotency_key=key,
            )
        except ToolCallRefused as refused:  # run policy: persisted with this result, not run
            return planned.index, CallResult(refused.content)
        if planned.warning:
            await self.journal.event(
                "tool.repetition_warning", {"tool": planned.tool, "model_seq": entry.seq}
            )
        arguments = planned.arguments or {}  # a RUN call always has validated arguments
        return await self._run(seq, planned, planned.tool, arguments, key, False)

    async def _run_read(self, entry: ModelEntry, planned: PlannedCall, tool: Tool) -> Ran:
        """A read-effect call runs first and is persisted once, finished, with its result: it
        changes nothing, so it needs no durable start (after a crash it simply runs again),
        and the model step that made it is written in the same transaction."""
        key = self.journal.idempotency_key(entry.seq, planned.index)
        arguments = planned.arguments or {}  # a RUN call always has validated arguments
        started_at = datetime.now(UTC)
        context = ToolContext(
            workdir=self.workdir,
            idempotency_key=key,
            deadline=time.monotonic() + self.limits.timeout_seconds,
            call_id=planned.call.id,
            reissued=False,
            files_written=self.files_written,
            invocation=self.invocation,
        )
        result = await execute_tool(tool, arguments, context, self.limits)
        if result.input_request:  # not finished after all: it needs a durable step to wait on
            try:
                seq = await self.journal.begin(
                    kind="tool",
                    name=planned.tool,
                    request=self._request(entry, planned, arguments, tool),
                    idempotency_key=key,
                )
            except ToolCallRefused as refused:
                return planned.index, CallResult(refused.content)
            return await self._asked(seq, planned, planned.tool, arguments, result)
        shown = _with_notices(self._for_endpoint(result), [planned.warning])
        try:
            recorded = await self.journal.record_call(
                name=planned.tool,
                request=self._request(entry, planned, arguments, tool),
                idempotency_key=key,
                response=shown.response(),
                error=shown.error,
                started_at=started_at,
            )
        except ToolCallRefused as refused:  # run policy: persisted with this result instead
            return planned.index, CallResult(refused.content)
        if planned.warning:
            await self.journal.event(
                "tool.repetition_warning", {"tool": planned.tool, "model_seq": entry.seq}
            )
        if not recorded.completed:  # begun only: its result goes with the run's notice
            return await self._complete(recorded.seq, planned, result)
        self.files_written.update(result.files_written)
        return planned.index, shown

    async def _resume(self, planned: PlannedCall, record: StepRecord) -> Ran:
        """Re-issue a started call, or run an approved one, completing its existing step."""
        # An approver may have edited the arguments: whatever runs must still fit the schema.
        checked = self._recheck(record.name, record.request.get("arguments"))
        if isinstance(checked, Invalid):
            failure = _failure(checked.message, self.limits.max_output_chars)
            return await self._complete(record.seq, planned, failure)
        if record.status == APPROVED:
            # What runs must be what the human approved (name, arguments, run, step, policy
            # version), checked at the last moment, not only when the decision was made.
            refusal = await self.journal.authorize(record.seq, record.name, checked)
            if refusal:
                failure = _failure(refusal, self.limits.max_output_chars)
                return await self._complete(record.seq, planned, failure)
        reissued = record.status == STARTED
        answer = record.request.get("answer") if record.status == APPROVED else None
        return await self._run(
            record.seq,
            planned,
            record.name,
            checked,
            record.idempotency_key,
            reissued,
            answer=answer if isinstance(answer, str) else "",
        )

    def _recheck(self, name: str, arguments: Any) -> dict[str, Any] | Invalid:
        tool = self.toolset.registry.get(name)
        if tool is None:
            return Invalid(f"Tool {name!r} is not available; it was not run.")
        checked = validate_arguments(name, json.dumps(arguments), tool.spec.parameters)
        return checked if isinstance(checked, Invalid) else checked.arguments

    async def _run(
        self,
        seq: int,
        planned: PlannedCall,
        name: str,
        arguments: dict[str, Any],
        key: str,
        reissued: bool,
        answer: str = "",
    ) -> Ran:
        tool = self.toolset.registry.get(name)
        if tool is None:
            failure = _failure(
                f"tool {name!r} is not available; it was not run.", self.limits.max_output_chars
            )
            return await self._complete(seq, planned, failure)
        context = ToolContext(
            workdir=self.workdir,
            idempotency_key=key,
            deadline=time.monotonic() + self.limits.timeout_seconds,
            call_id=planned.call.id,
            reissued=reissued,
            files_written=self.files_written,
            invocation=self.invocation,
            answer=answer,
        )
        result = await execute_tool(tool, arguments, context, self.limits)
        if result.input_request:
            return await self._asked(seq, planned, name, arguments, result)
        return await self._complete(seq, planned, result)

    async def _asked(
        self, seq: int, planned: PlannedCall, name: str, arguments: Any, result: CallResult
    ) -> Ran:
        """The call of step ``seq`` needs a person's answer: its step waits for one, or, where
        nobody can be asked, completes with why."""
        try:
            await self.journal.ask(seq, question=result.input_request)
        except ToolCallRefused as refused:
            return await self._complete(seq, planned, CallResult(refused.content, refused.content))
        return planned.index, Asked(
            {
                "seq": seq,
                "tool": name,
                "arguments": arguments,
                "reason": result.input_request,
                "kind": "input",
            }
        )

    async def _complete(
        self, seq: int, planned: PlannedCall, result: CallResult
    ) -> tuple[int, CallResult]:
        shown = self._for_endpoint(result)
        result = _with_notices(shown, [planned.warning, self.journal.tool_notice(seq)])
        self.files_written.update(result.files_written)
        await self.journal.complete(seq, response=result.response(), error=result.error)
        return planned.index, result

    def _for_endpoint(self, result: CallResult) -> CallResult:
        """``result`` as the endpoint can take it: without images (and saying why) when it
        does not accept images, so neither the journal nor the model gets them."""
        if not result.images or (self.endpoint is not None and self.endpoint.vision):
            return result
        name = self.endpoint.endpoint_name if self.endpoint is not None else ""
        note = not_shown_note(len(result.images), name)
        return replace(result, content=f"{result.content}\n\n{note}", images=())


def _with_notices(result: CallResult, notices: list[str]) -> CallResult:
    """The result as the model gets it: with the loop's and the run's notices appended."""
    shown = [n for n in notices if n]
    if not shown:
        return result
    return replace(result, content="\n\n".join([result.content, *shown]))


def _gated(record: StepRecord, planned: PlannedCall) -> dict[str, Any]:
    gated = {
        "seq": record.seq,
        "tool": record.name,
        "arguments": record.request.get("arguments"),
        "reason": record.request.get("gate_reason") or planned.message,
    }
    if record.request.get("input_request"):
        gated["kind"] = "input"
    return gated

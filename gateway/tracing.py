"""A ``/v1/chat/completions`` request's place in a trace, and its span.

The request joins the caller's trace when it sends a valid W3C ``traceparent`` (its span's
parent is the caller's span), else starts a trace of its own. Its log lines carry the trace and
span ids (``orchestrator.logcontext``); its record keeps the trace id; and when the ``OTEL_*``
variables ask for export (``orchestrator.otel``), one ``invoke_agent`` span with the GenAI
semantic conventions is exported when the request has ended. docs/observability.md.
"""

from __future__ import annotations

from contextvars import Token
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from orchestrator import otel
from orchestrator.logcontext import SPAN_ID, TRACE_ID
from orchestrator.otel import FinishedSpan
from orchestrator.tracecontext import caller_of, new_span_id, new_trace_id

if TYPE_CHECKING:
    from gateway.services import CompletionTally

SCOPE = "loopwright.gateway"


@dataclass(frozen=True, slots=True)
class ChatTrace:
    trace_id: str
    span_id: str
    #: The caller's span (from its ``traceparent``), "" when the request started the trace.
    parent_span_id: str = ""


def trace_marks() -> tuple[Token[str], Token[str]]:
    """Tokens that give the caller its trace and span ids back (:func:`trace_marks_reset`)."""
    return TRACE_ID.set(TRACE_ID.get()), SPAN_ID.set(SPAN_ID.get())


def trace_marks_reset(marks: tuple[Token[str], ...]) -> None:
    """Reset the context variables of ``marks`` (request id, trace, span), newest first."""
    for mark in reversed(marks):
        mark.var.reset(mark)


def chat_trace(traceparent: str | None) -> ChatTrace:
    """The request's trace (the caller's, or a new one) and a new span id, set for its logs."""
    trace_id, parent = caller_of(traceparent)
    trace = ChatTrace(trace_id or new_trace_id(), new_span_id(), parent)
    TRACE_ID.set(trace.trace_id)
    SPAN_ID.set(trace.span_id)
    return trace


def chat_span(trace: ChatTrace, tally: CompletionTally, duration_ms: int) -> FinishedSpan:
    """The request's ``invoke_agent`` span: the employee, its usage and outcome."""
    attributes: dict[str, object] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": tally.employee_username,
        "gen_ai.request.model": tally.employee_username,
        "gen_ai.response.id": tally.id,
        "gen_ai.usage.input_tokens": tally.prompt_tokens,
        "gen_ai.usage.output_tokens": tally.completion_tokens,
        "loopwright.span.kind": "chat",
        "loopwright.chat.stream": tally.stream,
        "loopwright.chat.model_steps": tally.model_steps,
        "loopwright.chat.tool_calls": tally.tool_calls,
    }
    if tally.finish_reason:
        attributes["gen_ai.response.finish_reasons"] = (tally.finish_reason,)
    failed = tally.status != "ok"
    if failed:
        attributes["error.type"] = tally.status
    return FinishedSpan(
        trace_id=trace.trace_id,
        span_id=trace.span_id,
        parent_span_id=trace.parent_span_id,
        remote_parent=bool(trace.parent_span_id),
        name=f"invoke_agent {tally.employee_username}",
        scope=SCOPE,
        started_at=tally.created_at,
        ended_at=tally.created_at + timedelta(milliseconds=max(0, duration_ms)),
        status="error" if failed else "ok",
        error=tally.error,
        kind="server",
        attributes=attributes,
    )


def chat_span_export(trace: ChatTrace, tally: CompletionTally, duration_ms: int) -> None:
    """Export the request's span, when the ``OTEL_*`` variables ask for it."""
    if otel.enabled():
        otel.export([chat_span(trace, tally, duration_ms)])

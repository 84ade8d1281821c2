"""A run's spans as OpenTelemetry spans: the GenAI semantic conventions plus ``loopwright.*``.

The export itself (the SDK, the OTLP/HTTP exporter, the ``OTEL_*`` variables that switch it on)
is :mod:`orchestrator.otel`; spans keep their stored trace id, span ids and times.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from loops.spans import Span
from orchestrator import otel
from orchestrator.otel import FinishedSpan

SCOPE = "loopwright.loops"
#: GenAI operation of each span kind (``gen_ai.operation.name``).
OPERATIONS = {
    "run": "invoke_agent",
    "invocation": "invoke_agent",
    "model": "chat",
    "tool": "execute_tool",
    "skill": "execute_tool",
    "subagent": "execute_tool",
    "mcp": "execute_tool",
    "a2a": "execute_tool",
    "retrieval": "execute_tool",
}


def export_spans(trace_id: str, spans: Sequence[Span]) -> None:
    """Hand a run's spans to the batch processor (exported in the background)."""
    otel.export(finished_span(trace_id, span) for span in spans)


def finished_span(trace_id: str, span: Span) -> FinishedSpan:
    """One stored span, ids and times unchanged."""
    return FinishedSpan(
        trace_id=trace_id,
        span_id=span.span_id,
        parent_span_id=span.parent_span_id,
        name=_name(span),
        scope=SCOPE,
        started_at=span.started_at,
        ended_at=span.ended_at or span.started_at,
        status=span.status,
        error=span.error,
        kind="client" if span.kind in ("model", "mcp", "a2a") else "internal",
        attributes=genai_attributes(span),
    )


def _name(span: Span) -> str:
    operation = OPERATIONS.get(span.kind, span.kind)
    if span.kind == "model":
        return f"chat {span.model or span.name}"
    return f"{operation} {span.name}" if operation != span.kind else span.name


def genai_attributes(span: Span) -> dict[str, Any]:
    """The span's attributes: GenAI semantic conventions plus ``loopwright.*``."""
    out: dict[str, Any] = {"loopwright.span.kind": span.kind}
    operation = OPERATIONS.get(span.kind)
    if operation:
        out["gen_ai.operation.name"] = operation
    if span.kind in ("run", "invocation"):
        out["gen_ai.agent.name"] = span.role or span.name
    if span.kind == "model":
        out.update(
            {
                "gen_ai.request.model": span.model,
                "gen_ai.response.model": span.model,
                "gen_ai.usage.input_tokens": span.tokens_in,
                "gen_ai.usage.output_tokens": span.tokens_out,
            }
        )
        if span.endpoint:
            out["loopwright.endpoint"] = span.endpoint
    elif operation == "execute_tool":
        out["gen_ai.tool.name"] = span.name
        if span.tier:
            out["loopwright.tool.tier"] = span.tier
    optional = {
        "loopwright.role": span.role,
        "loopwright.invocation": span.invocation,
        "loopwright.cost": span.cost,
        "loopwright.step_seq": span.step_seq,
        "error.type": span.error[:200] if span.status == "error" else "",
    }
    out.update({key: value for key, value in optional.items() if value not in ("", None)})
    for key in ("input", "output"):
        if key in span.attributes:
            out[f"loopwright.{key}"] = json.dumps(span.attributes[key], default=str)[:65_536]
    return out

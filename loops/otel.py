"""OpenTelemetry export of a run's spans (the official SDK and its OTLP/HTTP exporter).

Configured only by the standard ``OTEL_*`` variables and off when none asks for it: on when
``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set or
``OTEL_TRACES_EXPORTER`` is ``otlp``; ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``
keep it off. The exporter reads its endpoint, headers, timeout and compression from the same
variables; ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` name the service. Spans keep
their stored trace id, span ids and times and carry the GenAI semantic conventions.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from loops.spans import Span

SCOPE = InstrumentationScope("loopwright.loops")
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
}
_lock = threading.Lock()
_state: dict[str, Any] = {}


def enabled() -> bool:
    """Whether the ``OTEL_*`` variables ask for the OTLP export of traces."""
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return exporter == "otlp" or any(env.get(name) for name in endpoints)


def _processor() -> tuple[BatchSpanProcessor, Resource]:
    """This process's provider and batch processor, made on first use."""
    with _lock:
        if "processor" not in _state:
            resource = Resource.create({SERVICE_NAME: "loopwright"}).merge(Resource.create())
            provider = TracerProvider(resource=resource)
            processor = BatchSpanProcessor(OTLPSpanExporter())
            provider.add_span_processor(processor)
            _state.update(provider=provider, processor=processor, resource=resource)
        return _state["processor"], _state["resource"]


def export_spans(trace_id: str, spans: Sequence[Span]) -> None:
    """Hand a run's spans to the batch processor (exported in the background)."""
    processor, resource = _processor()
    for span in spans:
        processor.on_end(readable_span(trace_id, span, resource))


def flush(timeout_ms: int = 10_000) -> bool:
    """Export what the batch processor holds now (tests, and a worker shutting down)."""
    processor = _state.get("processor")
    return True if processor is None else bool(processor.force_flush(timeout_ms))


def _context(trace_id: str, span_id: str) -> SpanContext:
    return SpanContext(
        trace_id=int(trace_id, 16),
        span_id=int(span_id, 16),
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def readable_span(trace_id: str, span: Span, resource: Resource) -> ReadableSpan:
    """One stored span as the SDK's finished span, ids and times unchanged."""
    parent = _context(trace_id, span.parent_span_id) if span.parent_span_id else None
    status = {"ok": Status(StatusCode.OK), "error": Status(StatusCode.ERROR, span.error[:500])}
    return ReadableSpan(
        name=_name(span),
        context=_context(trace_id, span.span_id),
        parent=parent,
        resource=resource,
        attributes=genai_attributes(span),
        kind=SpanKind.CLIENT if span.kind in ("model", "mcp", "a2a") else SpanKind.INTERNAL,
        status=status.get(span.status, Status(StatusCode.UNSET)),
        start_time=_ns(span.started_at),
        end_time=_ns(span.ended_at or span.started_at),
        instrumentation_scope=SCOPE,
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

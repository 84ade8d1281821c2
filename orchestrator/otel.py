"""OpenTelemetry export of finished spans (the official SDK and its OTLP/HTTP exporter).

Configured only by the standard ``OTEL_*`` variables and off when none asks for it: on when
``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set or
``OTEL_TRACES_EXPORTER`` is ``otlp``; ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``
keep it off. The exporter reads its endpoint, headers, timeout and compression from the same
variables; ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` name the service. A span keeps
the trace id, span ids and times it is given: the apps map their records onto
:class:`FinishedSpan` (``loops.otel`` a run's spans, ``gateway.tracing`` a chat request's).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

_lock = threading.Lock()
_state: dict[str, Any] = {}


@dataclass(frozen=True, slots=True)
class FinishedSpan:
    """One ended span to export; ids are hex (32 for the trace, 16 for spans)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    scope: str
    started_at: datetime
    ended_at: datetime
    #: ``ok``, ``error`` or anything else (unset).
    status: str = ""
    error: str = ""
    #: ``client`` (a call out of the process), ``server`` (a request served) or ``internal``.
    kind: str = "internal"
    #: The parent lives in another process (a caller's ``traceparent``).
    remote_parent: bool = False
    attributes: Mapping[str, Any] = field(default_factory=dict)


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


def export(spans: Iterable[FinishedSpan]) -> None:
    """Hand finished spans to the batch processor (exported in the background)."""
    processor, resource = _processor()
    for span in spans:
        processor.on_end(readable(span, resource))


def flush(timeout_ms: int = 10_000) -> bool:
    """Export what the batch processor holds now (tests, and a process shutting down)."""
    processor = _state.get("processor")
    return True if processor is None else bool(processor.force_flush(timeout_ms))


def _context(trace_id: str, span_id: str, *, remote: bool = False) -> SpanContext:
    return SpanContext(
        trace_id=int(trace_id, 16),
        span_id=int(span_id, 16),
        is_remote=remote,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )


def unix_ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


_KINDS = {"client": SpanKind.CLIENT, "server": SpanKind.SERVER}


def readable(span: FinishedSpan, resource: Resource) -> ReadableSpan:
    """``span`` as the SDK's finished span, ids and times unchanged."""
    parent = (
        _context(span.trace_id, span.parent_span_id, remote=span.remote_parent)
        if span.parent_span_id
        else None
    )
    status = {"ok": Status(StatusCode.OK), "error": Status(StatusCode.ERROR, span.error[:500])}
    return ReadableSpan(
        name=span.name,
        context=_context(span.trace_id, span.span_id),
        parent=parent,
        resource=resource,
        attributes=dict(span.attributes),
        kind=_KINDS.get(span.kind, SpanKind.INTERNAL),
        status=status.get(span.status, Status(StatusCode.UNSET)),
        start_time=unix_ns(span.started_at),
        end_time=unix_ns(span.ended_at),
        instrumentation_scope=InstrumentationScope(span.scope),
    )

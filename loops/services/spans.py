"""A run's spans: read (live from the journal, or as stored), stored when it ends, pruned.

The span tree of a live run is built from its journal (``loops.spans``: steps, approvals and
``invocation.started`` events, each written with the step that produced it). The sweep
(``loops.spans_sweep``, every ``LOOPWRIGHT_SPAN_SWEEP_SECONDS``) stores the tree of every run
that ended, exports it (``loops.otel``, when the ``OTEL_*`` variables ask for it) and deletes
the spans whose retention has passed. docs/observability.md "Spans and OpenTelemetry".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from loops import otel
from loops.models import (
    ActionApproval,
    LoopEvent,
    LoopRun,
    LoopSpan,
    LoopSpanRecord,
    LoopStep,
)
from loops.services.budget_rules import INVOCATION_STARTED
from loops.spans import RunFacts, Span, build_spans
from loops.state import TERMINAL
from orchestrator import otel as otel_export

logger = logging.getLogger(__name__)

#: How far back the sweep looks for ended runs whose spans are not stored yet.
SWEEP_WINDOW = timedelta(days=30)
_STEP_FIELDS = (
    "seq",
    "role",
    "invocation",
    "kind",
    "status",
    "name",
    "request",
    "response",
    "error",
    "tokens_in",
    "tokens_out",
    "cost",
    "started_at",
    "finished_at",
    "duration_ms",
)
_APPROVAL_FIELDS = (
    "id",
    "step_seq",
    "role",
    "invocation",
    "tool_name",
    "status",
    "decided_by",
    "created_at",
    "decided_at",
)


@dataclass(frozen=True, slots=True)
class RunSpans:
    """A run's spans and where they come from: ``journal`` (live, built from the run's rows),
    ``stored`` (the record of an ended run) or ``pruned`` (stored, then past retention)."""

    run_id: str
    trace_id: str
    origin: str
    spans: list[Span]


def run_facts(run: LoopRun) -> RunFacts:
    return RunFacts(
        run_id=str(run.id),
        trace_id=run.trace_id,
        name=f"run {run.pattern.key}",
        status=run.status,
        created_at=run.created_at,
        started_at=run.started_at,
        finished_at=run.finished_at,
        failure_reason=run.failure_reason,
        harness_snapshots=run.harness_snapshots or {},
        role_bindings=run.role_bindings or {},
    )


def spans_of_journal(run: LoopRun) -> list[Span]:
    """The run's spans built from its journal now (three reads)."""
    steps = LoopStep.objects.filter(run=run).order_by("seq").values(*_STEP_FIELDS)
    approvals = ActionApproval.objects.filter(run=run).values(*_APPROVAL_FIELDS)
    starts: dict[str, datetime] = {}
    events = LoopEvent.objects.filter(run=run, type=INVOCATION_STARTED).values("data", "created_at")
    for event in events:
        invocation = str((event["data"] or {}).get("invocation") or "")
        starts.setdefault(invocation, event["created_at"])
    return build_spans(run_facts(run), list(steps), list(approvals), starts)


def run_spans(run: LoopRun) -> RunSpans:
    """The spans ``GET /api/v1/runs/{id}/spans`` answers: stored once the sweep has stored
    them, built from the journal before."""
    record = LoopSpanRecord.objects.filter(run=run).first()
    if record is None:
        return RunSpans(str(run.id), run.trace_id, "journal", spans_of_journal(run))
    stored = [_span_of(row) for row in LoopSpan.objects.filter(run=run).order_by("started_at")]
    origin = "stored" if stored or record.spans == 0 else "pruned"
    return RunSpans(str(run.id), run.trace_id, origin, stored)


def spans_record(*, run_id: Any, now: datetime | None = None) -> int:
    """Store an ended run's spans (once: a second call finds the record and does nothing),
    then export them after commit. Returns how many were stored."""
    now = now or timezone.now()
    with transaction.atomic():
        run = LoopRun.objects.select_related("pattern").select_for_update().get(pk=run_id)
        if run.status not in TERMINAL or LoopSpanRecord.objects.filter(run=run).exists():
            return 0
        spans = spans_of_journal(run)
        end = run.finished_at or now
        LoopSpan.objects.bulk_create([_row_of(run, span, end) for span in spans])
        exporting = otel_export.enabled() and bool(spans)
        LoopSpanRecord.objects.create(
            run=run, recorded_at=now, spans=len(spans), exported=exporting
        )
        if exporting:
            transaction.on_commit(lambda: otel.export_spans(run.trace_id, spans))
    return len(spans)


def spans_prune(*, now: datetime | None = None) -> int:
    """Delete the spans whose retention has passed; returns how many."""
    deleted, _ = LoopSpan.objects.filter(expires_at__lt=now or timezone.now()).delete()
    return deleted


@dataclass(frozen=True, slots=True)
class SweepReport:
    recorded: int
    spans: int
    pruned: int


def spans_sweep(*, now: datetime | None = None, limit: int = 200) -> SweepReport:
    """Store the spans of up to ``limit`` runs that ended (created within
    :data:`SWEEP_WINDOW`), then prune; safe to run twice at once (the record is unique)."""
    now = now or timezone.now()
    pending = (
        LoopRun.objects.filter(created_at__gte=now - SWEEP_WINDOW, status__in=list(TERMINAL))
        .filter(span_record__isnull=True)
        .order_by("created_at")
        .values_list("id", flat=True)[:limit]
    )
    recorded = spans = 0
    for run_id in list(pending):
        try:
            stored = spans_record(run_id=run_id, now=now)
        except Exception:  # one run's failure must not stop the others' spans
            logger.exception("storing the spans of run %s failed", run_id)
            continue
        recorded += 1
        spans += stored
    return SweepReport(recorded, spans, spans_prune(now=now))


def _row_of(run: LoopRun, span: Span, end: datetime) -> LoopSpan:
    return LoopSpan(
        run=run,
        span_id=span.span_id,
        parent_span_id=span.parent_span_id,
        kind=span.kind,
        name=span.name[:200],
        role=span.role,
        invocation=span.invocation,
        status=span.status,
        error=span.error,
        started_at=span.started_at,
        ended_at=span.ended_at,
        tokens_in=span.tokens_in,
        tokens_out=span.tokens_out,
        cost=span.cost,
        model=span.model[:200],
        endpoint=span.endpoint[:200],
        tier=span.tier,
        step_seq=span.step_seq,
        attributes=span.attributes,
        expires_at=end + timedelta(days=span.retention_days),
    )


def _span_of(row: LoopSpan) -> Span:
    return Span(
        span_id=row.span_id,
        parent_span_id=row.parent_span_id,
        kind=row.kind,
        name=row.name,
        role=row.role,
        invocation=row.invocation,
        status=row.status,
        started_at=row.started_at,
        ended_at=row.ended_at,
        error=row.error,
        tokens_in=row.tokens_in,
        tokens_out=row.tokens_out,
        cost=float(row.cost),
        model=row.model,
        endpoint=row.endpoint,
        tier=row.tier,
        step_seq=row.step_seq,
        attributes=dict(row.attributes or {}),
    )

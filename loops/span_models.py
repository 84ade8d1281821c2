"""The stored span record of ended runs (docs/observability.md "Spans and OpenTelemetry").

A live run's spans are built from its journal (``loops.spans``); when a run has ended, the span
sweep stores them here, exports them (OpenTelemetry, when configured) and prunes them when
their role's ``observability.tracingRetentionDays`` has passed.
"""

from __future__ import annotations

from django.db import models

from orchestrator.tracecontext import new_trace_id

__all__ = ["LoopSpan", "LoopSpanRecord", "new_trace_id"]


class LoopSpan(models.Model):
    """One span of an ended run's tree; ``expires_at`` is when the pruning task deletes it."""

    # Indexed by the (run, span_id) unique constraint, which serves run lookups too.
    run = models.ForeignKey(
        "loops.LoopRun", on_delete=models.CASCADE, related_name="spans", db_index=False
    )
    span_id = models.CharField(max_length=16)
    parent_span_id = models.CharField(max_length=16, blank=True, default="")
    kind = models.CharField(max_length=12)
    name = models.CharField(max_length=200)
    role = models.CharField(max_length=20, blank=True, default="")
    invocation = models.CharField(max_length=100, blank=True, default="")
    status = models.CharField(max_length=10)
    error = models.TextField(blank=True, default="")
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    model = models.CharField(max_length=200, blank=True, default="")
    endpoint = models.CharField(max_length=200, blank=True, default="")
    tier = models.CharField(max_length=10, blank=True, default="")
    step_seq = models.PositiveIntegerField(null=True, blank=True)
    attributes = models.JSONField(default=dict, blank=True)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["run", "started_at"]
        constraints = [
            models.UniqueConstraint(fields=["run", "span_id"], name="loops_span_run_span_unique")
        ]

    def __str__(self) -> str:
        return f"{self.run_id}:{self.span_id} {self.kind}:{self.name}"


class LoopSpanRecord(models.Model):
    """That an ended run's spans were stored (and exported); kept after they are pruned, so
    the sweep never stores them twice and the API can say they were pruned."""

    run = models.OneToOneField(
        "loops.LoopRun", on_delete=models.CASCADE, primary_key=True, related_name="span_record"
    )
    recorded_at = models.DateTimeField()
    spans = models.PositiveIntegerField(default=0)
    exported = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.run_id}: {self.spans} spans"

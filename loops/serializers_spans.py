"""The span tree of ``GET /api/v1/runs/{id}/spans`` (docs/observability.md)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class SpanSerializer(serializers.Serializer[dict[str, Any]]):
    span_id = serializers.CharField(help_text="16 hex digits.")
    parent_span_id = serializers.CharField(help_text="Empty for the run span.")
    kind = serializers.ChoiceField(
        choices=[
            "run",
            "invocation",
            "model",
            "tool",
            "skill",
            "subagent",
            "mcp",
            "a2a",
            "retrieval",
            "approval",
        ]
    )
    name = serializers.CharField()
    role = serializers.CharField(help_text="leader, maker or verifier; empty for the run.")
    invocation = serializers.CharField()
    status = serializers.ChoiceField(choices=["ok", "error", "running"])
    error = serializers.CharField()
    started_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(allow_null=True, help_text="null while open.")
    duration_ms = serializers.IntegerField(allow_null=True)
    tokens_in = serializers.IntegerField()
    tokens_out = serializers.IntegerField()
    cost = serializers.FloatField()
    model = serializers.CharField()
    endpoint = serializers.CharField()
    tier = serializers.CharField(help_text="A tool call's effect tier: read, write or external.")
    step_seq = serializers.IntegerField(allow_null=True, help_text="The step it was built from.")
    attributes = serializers.DictField(
        help_text="input and output, when the role's harness captures them."
    )


SpanSerializer._declared_fields["children"] = SpanSerializer(many=True)


class SpanTreeSerializer(serializers.Serializer[dict[str, Any]]):
    run = serializers.UUIDField()
    trace_id = serializers.CharField(help_text="The run's W3C trace id (32 hex digits).")
    origin = serializers.ChoiceField(
        choices=["journal", "stored", "pruned"],
        help_text="journal: built from the live run's rows; stored: kept since the run ended; "
        "pruned: past the retention of observability.tracingRetentionDays.",
    )
    spans = SpanSerializer(many=True, help_text="The root spans (the run), children nested.")

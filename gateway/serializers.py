"""API shapes of grants, chat completion records and per-employee guardrail settings."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from rest_framework import serializers

from gateway.models import ChatCompletionRecord, EmployeeChatSettings, EmployeeGrant
from orchestrator.agents.models import Employee
from orchestrator.strict import StrictModelSerializer, StrictSerializer


class EmployeeGrantSerializer(StrictModelSerializer[EmployeeGrant]):
    employee = serializers.SlugRelatedField(
        slug_field="username",
        queryset=Employee.objects.all(),
        help_text="The AI employee's username (the `model` clients send).",
    )
    user = serializers.SlugRelatedField(
        slug_field="username",
        queryset=User.objects.all(),
        help_text="The username that may call the employee.",
    )

    class Meta:
        model = EmployeeGrant
        fields = ["id", "employee", "user", "created_at", "created_by"]
        read_only_fields = ["id", "created_at", "created_by"]
        # A repeated grant is the service's 409 Conflict, not a field error.
        validators: list[Any] = []


class ChatCompletionRecordSerializer(serializers.ModelSerializer[ChatCompletionRecord]):
    user: serializers.SlugRelatedField[User] = serializers.SlugRelatedField(
        slug_field="username", read_only=True
    )

    class Meta:
        model = ChatCompletionRecord
        fields = [
            "id",
            "employee_username",
            "user",
            "created_at",
            "duration_ms",
            "stream",
            "status",
            "finish_reason",
            "prompt_tokens",
            "completion_tokens",
            "model_steps",
            "tool_calls",
            "guardrail_decisions",
            "end_user",
            "metadata",
            "error",
            "trace_id",
        ]
        read_only_fields = fields


class GuardrailSettingsSerializer(StrictSerializer):
    """``{"guardrails": {...}}``: the employee's guardrail configuration."""

    employee = serializers.CharField(read_only=True, source="employee.username")
    guardrails = serializers.JSONField(
        help_text="The guardrail configuration: input and output rules (docs/guardrails.md), "
        "validated by runtime.guardrails.GuardrailConfig."
    )
    updated_at = serializers.DateTimeField(read_only=True, allow_null=True)
    updated_by = serializers.CharField(read_only=True)

    @staticmethod
    def of(settings: EmployeeChatSettings) -> dict[str, Any]:
        return {
            "employee": settings.employee.username,
            "guardrails": settings.guardrails,
            "updated_at": settings.updated_at,
            "updated_by": settings.updated_by,
        }

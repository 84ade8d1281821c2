"""Who may call which AI employee over the OpenAI-compatible endpoint, each employee's chat
settings (guardrails), and one record per chat completion request (no message contents)."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from orchestrator.accounts.models import ApiToken
from orchestrator.agents.models import Employee


class EmployeeGrant(models.Model):
    """``user`` may call ``employee`` at ``/v1/chat/completions``; without a grant only admins
    may (deny by default)."""

    employee = models.ForeignKey(Employee, on_delete=models.CASCADE, related_name="chat_grants")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="employee_grants"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        ordering = ["employee__username", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["employee", "user"], name="gateway_grant_once"),
        ]

    def __str__(self) -> str:
        return f"{self.user_id} → {self.employee_id}"


class EmployeeChatSettings(models.Model):
    """An employee's settings for the endpoint: its guardrail configuration (JSON validated by
    ``runtime.guardrails.GuardrailConfig`` where that module exists)."""

    employee = models.OneToOneField(
        Employee, on_delete=models.CASCADE, related_name="chat_settings"
    )
    guardrails = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        verbose_name = "employee chat settings"
        verbose_name_plural = "employee chat settings"

    def __str__(self) -> str:
        return f"chat settings of {self.employee_id}"


class CompletionStatus(models.TextChoices):
    OK = "ok"
    ERROR = "error"
    BLOCKED = "blocked"


class ChatCompletionRecord(models.Model):
    """One ``/v1/chat/completions`` request, written once when it ends: who, which employee,
    how it ended, usage and guardrail decisions. Message contents are never stored."""

    id = models.CharField(primary_key=True, max_length=64)
    employee_username = models.CharField(max_length=150, db_index=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        on_delete=models.SET_NULL,
        related_name="chat_completions",
    )
    created_at = models.DateTimeField(db_index=True)
    duration_ms = models.PositiveIntegerField(default=0)
    stream = models.BooleanField(default=False)
    status = models.CharField(max_length=10, choices=CompletionStatus.choices)
    finish_reason = models.CharField(max_length=20, blank=True, default="")
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    model_steps = models.PositiveIntegerField(default=0)
    tool_calls = models.PositiveIntegerField(default=0)
    guardrail_decisions = models.JSONField(default=list, blank=True)
    #: The client's ``user`` and ``metadata`` fields (OpenAI's end-user id and tags), if sent.
    end_user = models.CharField(max_length=256, blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True, default="")
    #: The W3C trace the request belonged to (the caller's ``traceparent``, or its own).
    trace_id = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=CompletionStatus.values),
                name="gateway_record_status_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.employee_username}, {self.status})"


class TokenUsageDay(models.Model):
    """What one API token's chat completions used on one UTC day (:mod:`gateway.token_quotas`):
    one row per token and day, grown by one upsert per completion."""

    token = models.ForeignKey(ApiToken, on_delete=models.CASCADE, related_name="usage_days")
    day = models.DateField()
    tokens = models.PositiveBigIntegerField(default=0)
    cost = models.DecimalField(max_digits=14, decimal_places=6, default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["token", "day"], name="gateway_token_usage_day_once")
        ]

    def __str__(self) -> str:
        return f"token {self.token_id} {self.day}: {self.tokens} tokens, {self.cost} cost"


def new_completion_id() -> str:
    """An OpenAI-style completion id: ``chatcmpl-`` and 32 hex digits."""
    return f"chatcmpl-{uuid.uuid4().hex}"

"""Writes and decisions of the OpenAI-compatible endpoint: grants (who may call which
employee), per-employee chat settings, the harness a chat runs under, and the one record each
request leaves.

Deny by default: a user may call an employee only with a grant, or with the ``admin`` role.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from gateway.models import ChatCompletionRecord, EmployeeChatSettings, EmployeeGrant
from harness.services import harness_compile_for
from orchestrator.accounts.roles import Role, has_role
from orchestrator.agents.models import Employee
from orchestrator.errors import Conflict, InvalidInput, NotFound
from runtime.guardrails import GuardrailConfigInvalid, parse_guardrail_config

#: The harness profile a chat runs under when the employee names none of its own: the seeded
#: ``default`` profile (the platform layer alone trusts every tool, which would skip gates).
BASE_PROFILE = "default"


# --- Grants -----------------------------------------------------------------------------------


def grant_create(*, employee: Employee, user: User, actor: str) -> EmployeeGrant:
    """Let ``user`` call ``employee``; Conflict if the grant exists."""
    try:
        with transaction.atomic():
            return EmployeeGrant.objects.create(employee=employee, user=user, created_by=actor)
    except IntegrityError as exc:
        raise Conflict(f"{user.username} may already call {employee.username}.") from exc


def grant_delete(*, employee: Employee, user: User, actor: str) -> None:
    """Withdraw ``user``'s grant on ``employee``; NotFound if there is none."""
    deleted, _ = EmployeeGrant.objects.filter(employee=employee, user=user).delete()
    if not deleted:
        raise NotFound(f"{user.username} has no grant on {employee.username}.")


def may_call(user: Any, employee: Employee) -> bool:
    """Whether ``user`` may call ``employee``: an active admin, or a grant."""
    if user is None or not user.is_active:
        return False
    if has_role(user, Role.ADMIN):
        return True
    return EmployeeGrant.objects.filter(employee=employee, user=user).exists()


def callable_employees(user: Any) -> QuerySet[Employee]:
    """The employees ``user`` may call, by username."""
    employees = Employee.objects.order_by("username")
    if user is None or not user.is_active:
        return employees.none()
    if has_role(user, Role.ADMIN):
        return employees
    return employees.filter(chat_grants__user=user)


# --- Chat settings ----------------------------------------------------------------------------


def chat_settings_of(employee: Employee) -> EmployeeChatSettings:
    """The employee's chat settings (unsaved defaults when none were stored: no guardrails);
    read with the employee when it was selected with ``chat_settings``."""
    try:
        return employee.chat_settings
    except EmployeeChatSettings.DoesNotExist:
        empty = parse_guardrail_config({}).to_api()
        return EmployeeChatSettings(employee=employee, guardrails=empty)


def guardrails_update(*, employee: Employee, guardrails: Any, actor: str) -> EmployeeChatSettings:
    """Store the employee's guardrail configuration, validated by
    :class:`runtime.guardrails.GuardrailConfig` (InvalidInput naming each bad field, pointers
    under ``/guardrails``); stored in its API form (camelCase, defaults included)."""
    try:
        config = parse_guardrail_config(guardrails)
    except GuardrailConfigInvalid as exc:
        errors = [{**p, "pointer": "/guardrails" + p["pointer"]} for p in exc.problems]
        raise InvalidInput(
            f"The guardrail configuration has {len(errors)} problem(s).", errors=errors
        ) from exc
    settings, _ = EmployeeChatSettings.objects.update_or_create(
        employee=employee, defaults={"guardrails": config.to_api(), "updated_by": actor}
    )
    return settings


# --- The harness of a chat --------------------------------------------------------------------


def chat_harness_snapshot(employee: Employee) -> dict[str, Any]:
    """The compiled harness a chat with the employee runs under: platform → the employee's own
    profile (or :data:`BASE_PROFILE`) → its inline layer. No pattern, no run overrides.

    Raises InvalidInput (ProfileNotFound) for a broken harness field."""
    return harness_compile_for(
        tag=employee.harness_tag or BASE_PROFILE,
        employee_username=employee.username,
        employee_layer=dict(employee.harness or {}) or None,
    ).snapshot()


# --- Records ----------------------------------------------------------------------------------


@dataclass
class CompletionTally:
    """What one request did, filled in while it runs and written once at its end."""

    id: str
    employee_username: str
    user_id: int | None
    created_at: datetime
    stream: bool
    end_user: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    status: str = "ok"
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_steps: int = 0
    tool_calls: int = 0
    guardrail_decisions: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    #: The request's trace (the caller's ``traceparent``, or its own).
    trace_id: str = ""


def completion_record(tally: CompletionTally, duration_ms: int) -> ChatCompletionRecord:
    """Write the request's record (one transaction, one row); no message contents."""
    with transaction.atomic():
        return ChatCompletionRecord.objects.create(
            id=tally.id,
            employee_username=tally.employee_username,
            user_id=tally.user_id,
            created_at=tally.created_at,
            duration_ms=max(0, duration_ms),
            stream=tally.stream,
            status=tally.status,
            finish_reason=tally.finish_reason[:20],
            prompt_tokens=max(0, tally.prompt_tokens),
            completion_tokens=max(0, tally.completion_tokens),
            model_steps=max(0, tally.model_steps),
            tool_calls=max(0, tally.tool_calls),
            guardrail_decisions=tally.guardrail_decisions,
            end_user=tally.end_user,
            metadata=tally.metadata,
            error=tally.error[:4000],
            trace_id=tally.trace_id,
        )

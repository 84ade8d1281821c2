"""Who may call which employee at ``/v1/...``, and what a chat needs from the database.

Every function here runs on a thread with a database connection
(:func:`orchestrator.dbpool.db_call`).
A chat's preparation is reused while one stamp query finds nothing it was read from changed
(:mod:`gateway.prepared_cache`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone

from gateway import services
from gateway.errors import OpenAIError, invalid_api_key, model_not_found, permission_denied
from gateway.prepared_cache import ReuseCache, Stamp, stamp_read
from gateway.token_quotas import TokenQuota
from gateway.validation import CompletionRequest
from orchestrator.accounts.services import (
    api_token_live,
    api_token_resolve,
    api_token_split,
    api_token_touch,
)
from orchestrator.agents.clients import breaker_offloaded
from orchestrator.agents.models import Employee
from orchestrator.agents.wiring import EmployeeProfile, ProfileCache
from orchestrator.dbpool import db_call
from orchestrator.errors import DomainError
from runtime.chat import ChatTurn, chat_invocation
from runtime.guardrails import GuardrailConfig, parse_guardrail_config
from runtime.prompt_context import prompt_blocks_here

#: The employees' profiles of this process's chats; their model clients' breaker reads the
#: database (no Redis) on the endpoint's database threads.
PROFILES = ProfileCache(breaker=breaker_offloaded(db_call))
#: Preparations by (token prefix, employee), reused under an unchanged stamp.
_PREPARED: ReuseCache[Prepared] = ReuseCache()


# --- Who may call whom ------------------------------------------------------------------------


def _bearer(header: str) -> str:
    scheme, _, raw = header.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        raise invalid_api_key()
    return raw.strip()


def caller_of(authorization: str) -> User:
    """The active user of the bearer token, or 401 (call on a thread)."""
    token = api_token_resolve(_bearer(authorization))
    if token is None or not token.user.is_active:
        raise invalid_api_key()
    return token.user


def employee_for(user: User, model: str) -> Employee:
    """The employee ``model`` names if ``user`` may call it: 404 unknown, 403 no grant."""
    employee = Employee.objects.select_related("chat_settings").filter(username=model).first()
    if employee is None:
        raise model_not_found(model)
    if not services.may_call(user, employee):
        raise permission_denied(model)
    return employee


def models_of(authorization: str) -> list[dict[str, Any]]:
    """``/v1/models``: the employees the caller may use, as OpenAI model objects."""
    user = caller_of(authorization)
    return [model_object(e) for e in services.callable_employees(user)]


def model_of(authorization: str, model: str) -> dict[str, Any]:
    return model_object(employee_for(caller_of(authorization), model))


def model_object(employee: Employee) -> dict[str, Any]:
    return {
        "id": employee.username,
        "object": "model",
        "created": int(employee.created_at.timestamp()),
        "owned_by": "loopwright",
    }


# --- Preparing a chat -------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """Everything a chat needs from the database, read once before it starts."""

    user: User
    profile: EmployeeProfile
    harness: dict[str, Any]
    guardrails: GuardrailConfig
    request: CompletionRequest
    #: The apps' prompt blocks for this request (agent memory), read in the same trip.
    prompt_blocks: tuple[str, ...] = ()
    #: The calling token's daily quotas and usage today, read with this request's stamp.
    token_quota: TokenQuota | None = None


def prepare(user: User, request: CompletionRequest) -> Prepared:
    """Authorise ``user`` and read the employee's profile, harness and chat settings (call on
    a thread)."""
    employee = employee_for(user, request.model)
    try:
        profile = PROFILES.get(employee.username)
        harness = services.chat_harness_snapshot(employee)
        guardrails = parse_guardrail_config(services.chat_settings_of(employee).guardrails or {})
    except (DomainError, ValueError) as exc:
        why = exc.detail if isinstance(exc, DomainError) else str(exc)
        raise OpenAIError(503, f"The AI employee cannot run: {why}", code="misconfigured") from exc
    return Prepared(user, profile, harness, guardrails, request)


def prepare_for(authorization: str, request: CompletionRequest | OpenAIError) -> Prepared:
    """:func:`prepare` for the bearer of ``authorization``: 401 first, then the body's own
    refusal (``request`` as an error), then the employee's (call on a thread).

    The preparation is reused while one stamp query finds nothing it was read from changed
    (:mod:`gateway.prepared_cache`); the stamp is read before a full read, so a change in
    between only makes the next request read again. The token's quotas and usage come with
    the stamp, fresh on every request."""
    split = api_token_split(_bearer(authorization))
    stamp = None
    if split is not None and isinstance(request, CompletionRequest):
        stamp = stamp_read(split[0], request.model)
        reused = _reused(split, request, stamp) if stamp is not None else None
        if reused is not None:
            return reused
    user = caller_of(authorization)
    if isinstance(request, OpenAIError):
        raise request
    prepared = prepare(user, request)
    if split is not None and stamp is not None:
        _PREPARED.put((split[0], request.model), stamp, prepared)
    elif split is not None:  # made between the stamp and the full read: read it now
        stamp = stamp_read(split[0], request.model)
    return replace(prepared, token_quota=stamp.quota if stamp else None)


def prepare_chat(authorization: str, request: CompletionRequest | OpenAIError) -> Prepared:
    """:func:`prepare_for`, with the apps' prompt blocks for this request read on the same
    thread (never reused: memory changes between requests)."""
    prepared = prepare_for(authorization, request)
    turn = ChatTurn(messages=prepared.request.messages, user=prepared.user.username)
    chat = chat_invocation(employee=prepared.profile.username, harness=prepared.harness, turn=turn)
    chat = replace(chat, employee_tools=prepared.profile.tools)
    return replace(prepared, prompt_blocks=prompt_blocks_here(chat))


def _reused(split: tuple[str, str], request: CompletionRequest, stamp: Stamp) -> Prepared | None:
    """The preparation kept under ``stamp``, when the token's secret is right and it is live."""
    prefix, secret = split
    known = _PREPARED.get((prefix, request.model), stamp)
    now = timezone.now()
    if known is None or not api_token_live(secret, stamp, now):
        return None
    api_token_touch(stamp.token_id, stamp.last_used_at, now)
    return replace(known, request=request, token_quota=stamp.quota)

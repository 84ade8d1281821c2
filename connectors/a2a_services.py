"""Registering external A2A agents, reading their cards, and the rows of their calls.

A registration is saved whatever the agent answers; its card is then read at once (the
connection test). A reading that fails keeps the card read before and records why
(``card_error``), as MCP listings do (docs/interop.md).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from django.utils import timezone

from connectors.a2a_client import WAITING_STATES, AgentAccess, cancel_task, read_card
from connectors.models import A2AAgent, A2ACall
from connectors.services import failure_reason, header_values, row_update
from orchestrator.errors import NotFound, full_clean_or_invalid
from orchestrator.queue import enqueue
from runtime.tools.base import call_key

logger = logging.getLogger(__name__)
EDITABLE = ("card_url", "headers", "timeout_seconds", "effect", "enabled")


def a2a_agent_get(name: str) -> A2AAgent:
    agent = A2AAgent.objects.filter(name=name).first()
    if agent is None:
        raise NotFound(f"No A2A agent named {name!r}.")
    return agent


def a2a_agent_create(*, name: str, **fields: Any) -> A2AAgent:
    """Register an agent (checked by the outbound guard and the secret rule) and read its
    card."""
    agent = A2AAgent(name=name, **fields)
    full_clean_or_invalid(agent)
    agent.save()
    return a2a_agent_refresh(agent)


def a2a_agent_update(*, agent: A2AAgent, **fields: Any) -> A2AAgent:
    """Change the given fields (not the name: the tool name and harness layers carry it) and
    read the card again."""
    return a2a_agent_refresh(row_update(agent, fields, EDITABLE))


def a2a_agent_delete(*, agent: A2AAgent) -> None:
    agent.delete()


def agent_access(agent: A2AAgent) -> AgentAccess | str:
    """How to reach ``agent`` now (its header values read from their environment variables),
    or why it cannot be reached."""
    headers = header_values(agent.headers or {})
    if isinstance(headers, str):
        return headers
    return AgentAccess(
        name=agent.name,
        card_url=agent.card_url,
        timeout_seconds=float(agent.timeout_seconds),
        headers=headers,
    )


def a2a_agent_refresh(agent: A2AAgent) -> A2AAgent:
    """Read the agent's card now and store it; a failure is recorded in ``card_error`` (the
    earlier card is kept). Not for an event loop's thread."""
    access = agent_access(agent)
    try:
        if isinstance(access, str):
            raise ValueError(access)
        card = asyncio.run(asyncio.wait_for(read_card(access), access.timeout_seconds))
    except Exception as exc:
        agent.card_error = failure_reason(exc)
        logger.warning("A2A agent %s: reading its card failed: %s", agent.name, agent.card_error)
        agent.save(update_fields=["card_error"])
        return agent
    agent.card = card
    agent.card_read_at = timezone.now()
    agent.card_error = ""
    agent.save(update_fields=["card", "card_read_at", "card_error"])
    return agent


def a2a_call_open(*, idempotency_key: str, agent: A2AAgent) -> A2ACall:
    """The row of the call with this key: created on its first issue, found on a re-issue."""
    call, _ = A2ACall.objects.get_or_create(
        idempotency_key=idempotency_key, defaults={"agent": agent}
    )
    return call


def a2a_call_sending(*, call: A2ACall) -> None:
    """Mark the message as about to be sent (before it is)."""
    A2ACall.objects.filter(pk=call.pk).update(sent_at=timezone.now(), updated_at=timezone.now())


def a2a_call_task(*, call: A2ACall, task_id: str, context_id: str, state: str) -> None:
    """Record the remote task (its id as soon as it is known) and its latest state."""
    A2ACall.objects.filter(pk=call.pk).update(
        task_id=task_id, context_id=context_id, state=state[:20], updated_at=timezone.now()
    )


def a2a_call_answering(*, call: A2ACall, key: str) -> None:
    """Mark the answer of the approval ``key`` as about to be sent to the task (before it is)."""
    A2ACall.objects.filter(pk=call.pk).update(answered_key=key, updated_at=timezone.now())


def a2a_calls_abandoned(run_id: uuid.UUID, keys: list[str]) -> None:
    """The listener of ``runtime.run_cancellation.calls_abandoned``: hand the cancelling of
    those calls' remote tasks to a worker (network calls do not belong in the ending request)."""
    enqueue("connectors.cancel_abandoned_a2a_calls", [call_key(k) for k in keys])


def a2a_calls_cancel_waiting(keys: list[str]) -> int:
    """``tasks/cancel`` for the remote tasks of these calls that still wait for input (their run
    ended with the question unanswered); how many were cancelled. A failure is logged."""
    cancelled = 0
    waiting = A2ACall.objects.filter(idempotency_key__in=keys, state__in=WAITING_STATES)
    for call in waiting.exclude(task_id="").select_related("agent"):
        access = agent_access(call.agent)
        try:
            if isinstance(access, str):
                raise ValueError(access)
            state = asyncio.run(
                asyncio.wait_for(
                    cancel_task(access, call.agent.card, call.task_id), access.timeout_seconds
                )
            )
        except Exception as exc:
            logger.warning("A2A task %s: cancel failed: %s", call.task_id, failure_reason(exc))
            continue
        a2a_call_task(call=call, task_id=call.task_id, context_id=call.context_id, state=state)
        cancelled += 1
    return cancelled

"""A2A tasks over runs: who calls, which pattern is served, starting, reading and cancelling the
run behind a task. Runs start with the trigger service (``run_trigger``) and are cancelled with
the human-action service (``run_act``), so the rules of the REST API hold here unchanged.

The task id is the run id; the task's context id is kept on the run as its ``trigger_ref``
(``trigger_type`` ``a2a``). Every function is synchronous and uses the calling thread's
database connection.
"""

from __future__ import annotations

import uuid
from typing import Any

from a2a_server.records import A2ACaller, EvidenceView, RunView, ServedPattern
from loops.models import (
    ActionApproval,
    ApprovalStatus,
    LoopArtifact,
    LoopPattern,
    LoopRun,
    RunStatus,
)
from loops.services.runs import run_act, run_trigger
from loops.templates import template_inputs
from orchestrator.accounts.roles import Role, has_role, user_roles
from orchestrator.accounts.services import api_token_resolve
from orchestrator.errors import NotFound

#: ``LoopRun.trigger_type`` of the runs started by an A2A message.
A2A_TRIGGER = "a2a"
#: The longest context id kept (``LoopRun.trigger_ref``).
MAX_CONTEXT_ID = 200


def a2a_caller_resolve(raw: str) -> A2ACaller | None:
    """The caller owning the live API token ``raw``; None for an unknown, expired or revoked
    token or an inactive user."""
    token = api_token_resolve(raw)
    if token is None or not token.user.is_active:
        return None
    user = token.user
    return A2ACaller(
        user_id=int(user.pk),
        username=str(user.username),
        can_read=bool(user_roles(user)),
        can_operate=has_role(user, Role.OPERATOR),
    )


def served_pattern(key: str) -> ServedPattern:
    """The pattern ``key`` if it is served as an A2A agent; NotFound (404) otherwise, the same
    for a pattern that does not exist and one that is not ``a2a_enabled``."""
    pattern = LoopPattern.objects.filter(key=key, a2a_enabled=True).first()
    if pattern is None:
        raise NotFound(f"No pattern {key!r} is served as an A2A agent.")
    return ServedPattern(
        key=pattern.key,
        title=pattern.title,
        description=pattern.description,
        goal_template=pattern.goal_template,
        version=int(pattern.version),
        inputs=tuple(template_inputs(pattern.goal_template)),
    )


def a2a_run_start(
    *, pattern_key: str, caller: A2ACaller, inputs: dict[str, Any], context_id: str
) -> RunView:
    """Start a run of the served pattern with ``inputs`` (a manual trigger's rules: a disabled
    pattern, a spent budget, an open breaker are 409 problems; a goal template missing an input
    a 400)."""
    pattern = LoopPattern.objects.filter(key=pattern_key, a2a_enabled=True).first()
    if pattern is None:
        raise NotFound(f"No pattern {pattern_key!r} is served as an A2A agent.")
    run = run_trigger(
        pattern=pattern,
        actor=caller.username,
        inputs=inputs,
        trigger_type=A2A_TRIGGER,
        trigger_ref=context_id[:MAX_CONTEXT_ID],
    )
    view = a2a_run_view(pattern_key=pattern_key, task_id=str(run.id))
    assert view is not None  # just created, in this transaction's view
    return view


def _run_of(pattern_key: str, task_id: str) -> LoopRun | None:
    try:
        run_id = uuid.UUID(task_id)
    except ValueError:
        return None
    return (
        LoopRun.objects.filter(pk=run_id, pattern__key=pattern_key)
        .select_related("pattern")
        .first()
    )


def a2a_run_view(*, pattern_key: str, task_id: str) -> RunView | None:
    """The run behind task ``task_id`` of the pattern; None when the pattern has no such run."""
    run = _run_of(pattern_key, task_id)
    if run is None:
        return None
    verdict = run.result if isinstance(run.result, dict) else None
    pending: tuple[str, ...] = ()
    if run.status == RunStatus.WAITING_APPROVAL:
        pending = tuple(
            ActionApproval.objects.filter(run=run, status=ApprovalStatus.PENDING)
            .order_by("step_seq")
            .values_list("tool_name", flat=True)
        )
    evidence: tuple[EvidenceView, ...] = ()
    if run.status == RunStatus.SUCCEEDED and verdict is not None:
        evidence = _evidence(run, verdict)
    return RunView(
        id=str(run.id),
        pattern=pattern_key,
        status=str(run.status),
        context_id=run.trigger_ref if run.trigger_type == A2A_TRIGGER else "",
        updated_at=run.updated_at,
        terminal_reason=run.terminal_reason,
        failure_reason=run.failure_reason,
        verdict=verdict,
        evidence=evidence,
        pending_tools=pending,
    )


def _evidence(run: LoopRun, verdict: dict[str, Any]) -> tuple[EvidenceView, ...]:
    """The run's artifacts the verdict's checks cite, in creation order."""
    cited: dict[str, list[str]] = {}
    checks = verdict.get("checks")
    for check in checks if isinstance(checks, list) else []:
        if not isinstance(check, dict):
            continue
        evidence = check.get("evidence")
        for item in evidence if isinstance(evidence, list) else []:
            cited.setdefault(str(item), []).append(str(check.get("name", "")))
    ids = []
    for raw in cited:
        try:
            ids.append(int(raw))
        except ValueError:
            continue
    rows = LoopArtifact.objects.filter(run=run, id__in=ids).order_by("created_at", "id")
    return tuple(
        EvidenceView(
            id=str(row.id),
            kind=row.kind,
            name=row.name,
            content_type=row.content_type,
            content=row.content,
            checks=tuple(cited[str(row.id)]),
        )
        for row in rows
    )


def a2a_run_cancel(*, pattern_key: str, task_id: str, actor: str) -> RunView | None:
    """Cancel the run behind the task (the ``cancel`` human action); None when the pattern has
    no such run, a 409 Conflict when the run has already ended."""
    run = _run_of(pattern_key, task_id)
    if run is None:
        return None
    run_act(run_id=run.id, action="cancel", actor=actor, reason="canceled over A2A")
    return a2a_run_view(pattern_key=pattern_key, task_id=task_id)

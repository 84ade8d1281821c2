"""What a decision on an approval is, apart from how it is stored.

Who may decide, the checks of the decision and of its input, the approval's new fields, the
gated step's new columns and the event the decision logs. Both store paths of
``approvals.approval_decide`` (the exact one, statement by statement, and the batched one in
``approval_fast``) apply exactly these, on rows they read under the run's lock.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from harness.planner import plan_tools
from loops.models import (
    ActionApproval,
    ApprovalKind,
    ApprovalStatus,
    LoopRun,
    RunStatus,
    StepStatus,
)
from loops.services.approval_reviews import review_checked, review_text, schema_errors
from orchestrator.accounts.roles import Role, has_role
from orchestrator.errors import Conflict, DomainError, InvalidInput
from runtime.tools.base import APPROVAL_KEY_MARK, call_key
from runtime.tools.specs import tool_spec

#: The longest answer a person may give to a call's question.
MAX_ANSWER_CHARS = 10_000


class NotAnApprover(DomainError):
    status_code = 403
    title = "Forbidden"


def canonical_hash(*parts: Any) -> str:
    """SHA-256 of the canonical JSON of ``parts`` (sorted keys, no whitespace)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def role_snapshot(run: LoopRun, role: str, employee: str) -> dict[str, Any]:
    """The harness snapshot the run pinned for ``role`` (a maker's by its employee)."""
    snaps = run.harness_snapshots or {}
    if role == "maker":
        return dict((snaps.get("makers") or {}).get(employee) or {})
    return dict(snaps.get(role) or {})


def policy_version(snapshot: dict[str, Any]) -> str:
    profile = snapshot.get("profile") or {}
    return f"{profile.get('tag', '?')}@{profile.get('version', '?')}"


def may_decide(user: Any, run: LoopRun) -> bool:
    """Approvers decide, and so do the users the run's policy lists as its approvers."""
    if has_role(user, Role.APPROVER):
        return True
    approvers = (run.policy_snapshot.get("approvals") or {}).get("approvers") or []
    return bool(getattr(user, "is_authenticated", False)) and user.username in approvers


@dataclass(frozen=True)
class DecisionAsked:
    """A decision as it was asked for (the API's body, validated for its shape only)."""

    decision: str
    input: Any = None
    reason: str = ""
    answer: Any = None
    review: Any = None


@dataclass(frozen=True)
class Decided:
    """What a decision writes besides the approval's own fields: the arguments that will run
    (None: the call is not run) and the tool result a refusal leaves, and the event it logs."""

    final: dict[str, Any] | None
    rejection: str
    event_type: str
    event_data: dict[str, Any]


def decided(approval: ActionApproval, run: LoopRun, user: Any, asked: DecisionAsked) -> Decided:
    """Check the decision against the locked ``approval`` and ``run`` and set the approval's
    decision fields; raise (403, 409, 400) with nothing set worth keeping otherwise."""
    if not may_decide(user, run):
        raise NotAnApprover("Only approvers (or the pattern's listed approvers) may decide.")
    if approval.status != ApprovalStatus.PENDING:
        raise Conflict(
            f"This approval was already decided: {approval.status}.", current_status=approval.status
        )
    if run.status != RunStatus.WAITING_APPROVAL:
        raise Conflict(
            f"The run is '{run.status}', not waiting for approval.", current_status=run.status
        )
    actor = user.username
    approval.review = review_checked(approval, asked.review)
    final: dict[str, Any] | None = None
    if approval.kind == ApprovalKind.INPUT and asked.decision == "approve":
        raise InvalidInput(
            "This is a question the call asked: answer it (decision 'answer' with an answer) "
            "or reject it.",
            errors=[{"pointer": "/decision", "detail": "answer or reject", "code": "invalid"}],
        )
    if asked.decision == "answer":
        approval.answer = _checked_answer(approval, asked.answer)
        final = _checked_input(approval, run, None)
    elif asked.decision == "approve":
        final = _checked_input(approval, run, asked.input)
        approval.decided_input = asked.input
    if final is not None:
        approval.status = ApprovalStatus.APPROVED
        approval.approved_hash = canonical_hash(
            approval.tool_name, final, str(run.id), approval.step_seq, approval.policy_version
        )
    else:
        approval.status = ApprovalStatus.REJECTED
    approval.decided_by, approval.decision_reason = actor, asked.reason
    approval.decided_at = timezone.now()
    return Decided(
        final=final,
        rejection=_rejection(approval, actor, asked.reason),
        event_type=f"approval.{approval.status}",
        event_data={
            "approval": str(approval.id),
            "tool": approval.tool_name,
            "edited": asked.input is not None,
            "reviewed": approval.review is not None,
            "reason": asked.reason,
            "kind": approval.kind,
        },
    )


#: The approval's columns a decision sets.
DECIDED_FIELDS = (
    "status",
    "review",
    "answer",
    "decided_input",
    "approved_hash",
    "decided_by",
    "decided_at",
    "decision_reason",
)


def _rejection(approval: ActionApproval, actor: str, reason: str) -> str:
    rejected = (
        f"Rejected by {actor}" + (f": {reason}" if reason else "") + ". The call was not executed."
    )
    if approval.kind == ApprovalKind.INPUT:
        rejected = (
            f"{actor} declined to answer the question ({approval.reason})"
            + (f": {reason}" if reason else "")
            + ". The call stopped there, unanswered."
        )
    if approval.review is not None:
        rejected = f"{rejected}\n{review_text(approval)}"
    return rejected


def _checked_input(approval: ActionApproval, run: LoopRun, edited: Any) -> dict[str, Any]:
    """The arguments that will run: validated against the tool's schema and re-checked
    against the run's harness snapshot (a denied tool can never be approved into running)."""
    spec = tool_spec(approval.tool_name)
    if spec is None:
        raise Conflict(f"Tool {approval.tool_name!r} no longer exists; it cannot be approved.")
    arguments = approval.arguments if edited is None else edited
    if not isinstance(arguments, dict):
        raise InvalidInput(
            "input must be a JSON object of tool arguments.",
            errors=[{"pointer": "/input", "detail": "must be an object", "code": "type"}],
        )
    errors = schema_errors(spec.parameters, arguments, "/input")
    if errors:
        raise InvalidInput(
            f"The edited input does not fit {approval.tool_name}: {errors[0]['detail']}",
            errors=errors,
        )
    settings = role_snapshot(run, approval.role, approval.employee_username).get("settings")
    decision = plan_tools(settings, [spec]).decision(spec.name) if settings else "deny"
    if approval.role == "leader" and spec.effect != "read":
        decision = "deny"
    if decision == "deny":
        raise Conflict(f"The run's policy denies {approval.tool_name!r}; it cannot be approved.")
    return arguments


def _checked_answer(approval: ActionApproval, answer: Any) -> str:
    if approval.kind != ApprovalKind.INPUT:
        raise InvalidInput(
            "answer is only for a question a call asked; approve or reject this call.",
            errors=[{"pointer": "/answer", "detail": "not a question", "code": "invalid"}],
        )
    if not isinstance(answer, str) or not answer.strip():
        raise InvalidInput(
            "answer must be the non-empty text that answers the question.",
            errors=[{"pointer": "/answer", "detail": "required", "code": "required"}],
        )
    if len(answer) > MAX_ANSWER_CHARS:
        raise InvalidInput(
            f"answer is longer than {MAX_ANSWER_CHARS} characters.",
            errors=[{"pointer": "/answer", "detail": "too long", "code": "max_length"}],
        )
    return answer


def step_rewritten(
    step: dict[str, Any],
    approval: ActionApproval,
    *,
    arguments: dict[str, Any] | None,
    content: str,
    now: datetime,
) -> dict[str, Any]:
    """The gated step's new columns once its approval is decided: ``approved`` with the
    arguments that will run and a key naming the approval, or ``completed`` with ``content``
    as the call's result. ``step``: its ``status``, ``request`` and ``idempotency_key``;
    Conflict when it is no longer gated."""
    if step["status"] != StepStatus.GATED:
        raise Conflict(f"The gated call is already '{step['status']}'.")
    if arguments is None:
        return {
            "status": StepStatus.COMPLETED,
            "response": {"content": content, "decision": approval.status},
            "finished_at": now,
        }
    request = {**step["request"], "arguments": arguments, "approval_id": str(approval.id)}
    if approval.kind == ApprovalKind.INPUT:
        request["answer"] = approval.answer
    # The call's own key with this approval: the latest decision binds what runs.
    key = f"{call_key(step['idempotency_key'])}{APPROVAL_KEY_MARK}{approval.id}"
    return {"status": StepStatus.APPROVED, "request": request, "idempotency_key": key}

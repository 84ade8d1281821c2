"""Approvals: a gated tool call waits for a human; the decision binds exactly that call.

Life of an approval: the engine opens one per gated step when the run parks in
``waiting_approval`` (same transaction). ``approval_decide`` records the decision once (the row
is locked; a second decision is a 409), rewrites the gated step — ``approved`` with the final
arguments and an idempotency key naming the approval, or ``completed`` with the rejection as
the tool's result — and re-queues the run when nothing is pending any more. The reaper expires
approvals past their deadline: the model is told the request *timed out*, never that a human
denied it.

A question a running call asked (kind ``input``: a remote agent's ``input-required``) is
decided the same way with ``answer``: the step becomes ``approved`` with the answer in its
request and the call runs again, taking up where it stopped; a rejection completes it. A call
may ask again: each question is a new approval of the same step (one pending at a time).
"""

from __future__ import annotations

import functools
import uuid
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from loops import db
from loops.models import (
    ActionApproval,
    ApprovalKind,
    ApprovalStatus,
    LoopRun,
    LoopStep,
    RunStatus,
    StepStatus,
)
from loops.services.approval_decisions import (
    DECIDED_FIELDS,
    DecisionAsked,
    NotAnApprover,
    canonical_hash,
    decided,
    may_decide,
    policy_version,
    role_snapshot,
    step_rewritten,
)
from loops.services.approval_fast import approval_decide_batched
from loops.services.approval_reviews import approval_forms, review_text
from loops.services.notifications import notify_approvals
from loops.services.transitions import Lease, fenced_touch, run_event_append, run_transition
from orchestrator.errors import Conflict
from runtime.run_cancellation import calls_abandoned
from runtime.tools.base import APPROVAL_KEY_MARK


def approvals_open(
    *, lease: Lease, role: str, invocation: str, employee: str, gated: list[dict[str, Any]]
) -> list[ActionApproval]:
    """Open one approval per gated call (idempotent). Call inside the parking transaction."""
    run = LoopRun.objects.get(pk=lease.run_id)
    snapshot = role_snapshot(run, role, employee)
    timeout = (run.policy_snapshot.get("approvals") or {}).get("timeoutSeconds")
    expires_at = timezone.now() + timedelta(seconds=timeout) if timeout else None
    opened = []
    for call in gated:
        seq = int(call["seq"])
        if ActionApproval.objects.filter(
            run=run, step_seq=seq, status=ApprovalStatus.PENDING
        ).exists():
            continue  # a resumed step that is still waiting: its approval is already open
        arguments = call.get("arguments") or {}
        interaction_schema, review_schema = approval_forms(call["tool"], call.get("kind"))
        opened.append(
            ActionApproval.objects.create(
                run=run,
                step_seq=seq,
                role=role,
                invocation=invocation,
                employee_username=employee,
                tool_name=call["tool"],
                kind=ApprovalKind.INPUT if call.get("kind") == "input" else ApprovalKind.CALL,
                arguments=arguments,
                interaction_schema=interaction_schema,
                review_schema=review_schema,
                reason=call.get("reason", ""),
                proposal_hash=canonical_hash(
                    call["tool"], arguments, str(run.id), seq, policy_version(snapshot)
                ),
                policy_version=policy_version(snapshot),
                expires_at=expires_at,
            )
        )
    if opened:
        notify_approvals([a.id for a in opened])
    return opened


def _latest(run_id: uuid.UUID, seq: int) -> Any:
    """The approvals of step ``seq``, newest first (a call that asked again has several)."""
    return ActionApproval.objects.filter(run_id=run_id, step_seq=seq).order_by("-created_at")


def _rewrite_step(
    approval: ActionApproval, *, arguments: dict[str, Any] | None, content: str
) -> None:
    step = LoopStep.objects.select_for_update().get(run_id=approval.run_id, seq=approval.step_seq)
    row = {"status": step.status, "request": step.request, "idempotency_key": step.idempotency_key}
    fields = step_rewritten(row, approval, arguments=arguments, content=content, now=timezone.now())
    for name, value in fields.items():
        setattr(step, name, value)
    step.save(update_fields=list(fields))


def _resume_if_settled(run: LoopRun, actor: str) -> None:
    if ActionApproval.objects.filter(run=run, status=ApprovalStatus.PENDING).exists():
        return
    run_transition(
        run_id=run.id,
        to=RunStatus.QUEUED,
        actor=actor,
        event_type="approval.resumed",
        expected_from=[RunStatus.WAITING_APPROVAL],
    )


def _lock(
    approval_id: uuid.UUID, run_id: uuid.UUID | None = None
) -> tuple[ActionApproval, LoopRun]:
    """Lock the run (its pattern read along, unlocked), then the approval: the order
    ``run_transition`` (which withdraws a dead run's approvals under the run's lock) uses too,
    so the two never deadlock. ``run_id``: the approval's run when the caller has read it (an
    approval never changes runs). The approval comes back with the run attached."""
    if run_id is None:
        run_id = ActionApproval.objects.values_list("run_id", flat=True).get(pk=approval_id)
    run = LoopRun.objects.select_for_update(of=("self",)).select_related("pattern").get(pk=run_id)
    approval = ActionApproval.objects.select_for_update().get(pk=approval_id, run_id=run_id)
    approval.run = run
    return approval, run


def approval_check_decider(*, approval: ActionApproval, user: Any) -> None:
    """Raise NotAnApprover unless ``user`` may decide this approval (no lock, no write): the
    view asks before it reads the body, so who may act is answered before what was sent.
    ``approval_decide`` asks again under the run's lock."""
    if not may_decide(user, approval.run):
        raise NotAnApprover("Only approvers (or the pattern's listed approvers) may decide.")


def approval_decide(
    *,
    approval_id: uuid.UUID,
    user: Any,
    decision: str,
    input: Any = None,
    reason: str = "",
    answer: Any = None,
    review: Any = None,
    run_id: uuid.UUID | None = None,
) -> ActionApproval:
    """Approve (optionally with edited input), answer (a call's question) or reject, once; with
    the review its schema asks for (``approval_reviews``), which the model is then told.
    ActionApproval.DoesNotExist for an unknown ``approval_id``.

    On PostgreSQL the decision is two round trips (``approval_fast``); the exact path writes
    the same rows statement by statement (a run in a wait or held by a worker takes it)."""
    asked = DecisionAsked(decision, input, reason, answer, review)
    if db.batches_are_sent_together():
        try:
            return approval_decide_batched(approval_id, user, asked)
        except db.NotPlain:
            pass
    return _decide_exact(approval_id, user, asked, run_id)


@transaction.atomic
def _decide_exact(
    approval_id: uuid.UUID, user: Any, asked: DecisionAsked, run_id: uuid.UUID | None
) -> ActionApproval:
    approval, run = _lock(approval_id, run_id)
    outcome = decided(approval, run, user, asked)
    approval.save(update_fields=DECIDED_FIELDS)
    _rewrite_step(approval, arguments=outcome.final, content=outcome.rejection)
    run_event_append(
        run_id=run.id, type=outcome.event_type, actor=user.username, data=outcome.event_data
    )
    _resume_if_settled(run, user.username)
    return approval


@transaction.atomic
def approval_authorize_execution(
    lease: Lease, *, seq: int, name: str, arguments: dict[str, Any]
) -> str:
    """The last check before an approved call runs (docs/reliability.md A2): the call about to run
    must be the approved one (tool name, canonical arguments, run, step, policy version) and
    still be approved. Records ``executed_hash`` and returns "" when it may run; otherwise
    records an ``approval.execution_refused`` event and returns why it may not.

    Fenced by the lease: a worker that lost the run is refused (LeaseLost) before anything runs.
    Idempotent for a re-issue of the same call after a crash (same hash, same key).
    """
    return _authorized(lease, seq=seq, name=name, arguments=arguments)[0]


@transaction.atomic
def approval_authorize_reviewed(
    lease: Lease, *, seq: int, name: str, arguments: dict[str, Any]
) -> tuple[str, str]:
    """:func:`approval_authorize_execution`, with the review of the approval the call runs under:
    ``(refusal, review)``; the review goes to the model with the call's result."""
    refusal, approval = _authorized(lease, seq=seq, name=name, arguments=arguments)
    return refusal, "" if refusal or approval is None else review_text(approval)


def _authorized(
    lease: Lease, *, seq: int, name: str, arguments: dict[str, Any]
) -> tuple[str, ActionApproval | None]:
    """The check of :func:`approval_authorize_execution` and the approval it judged."""
    fenced_touch(lease)
    approval = _latest(lease.run_id, seq).select_for_update().first()
    refusal = _execution_refusal(lease.run_id, seq, approval, name, arguments)
    if approval is None or refusal:
        run_event_append(
            run_id=lease.run_id,
            type="approval.execution_refused",
            actor=lease.owner,
            lease=lease,
            data={
                "approval": str(approval.id) if approval else None,
                "step": seq,
                "tool": name,
                "reason": refusal,
            },
        )
        return f"The approved call was not run: {refusal}", approval
    if not approval.executed_hash:
        approval.executed_hash = approval.approved_hash
        approval.save(update_fields=["executed_hash"])
    return "", approval


def _execution_refusal(
    run_id: uuid.UUID,
    seq: int,
    approval: ActionApproval | None,
    name: str,
    arguments: dict[str, Any],
) -> str:
    if approval is None:
        return "no approval exists for this call."
    if approval.status != ApprovalStatus.APPROVED:
        return f"its approval is {approval.status}, not approved."
    step = LoopStep.objects.get(run_id=run_id, seq=seq)
    run = LoopRun.objects.only("harness_snapshots").get(pk=run_id)
    snapshot = role_snapshot(run, approval.role, approval.employee_username)
    if step.status != StepStatus.APPROVED or not step.idempotency_key.endswith(
        f"{APPROVAL_KEY_MARK}{approval.id}"
    ):
        return f"the step is '{step.status}' and not bound to approval {approval.id}."
    if name != approval.tool_name:
        return f"the tool {name!r} is not the approved {approval.tool_name!r}."
    if policy_version(snapshot) != approval.policy_version:
        return f"the run's policy is {policy_version(snapshot)}, not {approval.policy_version}."
    digest = canonical_hash(name, arguments, str(run_id), seq, approval.policy_version)
    if digest != approval.approved_hash:
        return "its arguments differ from the approved ones."
    return ""


def approval_record_execution(*, run_id: uuid.UUID, step_seq: int, arguments: Any) -> None:
    """The approved call finished: stamp ``executed_at`` (inside the step's transaction).

    The hash of what ran was recorded when the call was authorized; ``arguments`` (the step's
    at completion) must still match it, or nothing is stamped."""
    approval = _latest(run_id, step_seq).first()
    if approval is None or not approval.executed_hash:
        return  # not approved, or refused before it ran
    digest = canonical_hash(
        approval.tool_name, arguments, str(run_id), step_seq, approval.policy_version
    )
    if digest == approval.executed_hash and approval.executed_at is None:
        approval.executed_at = timezone.now()
        approval.save(update_fields=["executed_at"])


def approvals_withdraw(*, run_id: uuid.UUID, actor: str, status: str) -> int:
    """The run ended (``status``) while calls of it waited for a decision: withdraw them, so
    the queue never shows a dead run's approvals and a late decision is a clean 409.

    Call inside the terminal transition's transaction, with the run row locked."""
    pending = list(
        ActionApproval.objects.select_for_update().filter(
            run_id=run_id, status=ApprovalStatus.PENDING
        )
    )
    now = timezone.now()
    for approval in pending:
        approval.status, approval.decided_by, approval.decided_at = (
            ApprovalStatus.WITHDRAWN,
            actor,
            now,
        )
        approval.decision_reason = f"Withdrawn: the run ended ({status}) before anyone decided."
        approval.save(update_fields=["status", "decided_by", "decided_at", "decision_reason"])
        try:
            _rewrite_step(
                approval,
                arguments=None,
                content=f"The run ended ({status}) before anyone decided; the call was not run.",
            )
        except Conflict:
            continue  # the step is no longer gated: nothing to rewrite
    _abandon_questions(run_id, pending)
    return len(pending)


def _abandon_questions(run_id: uuid.UUID, approvals: list[ActionApproval]) -> None:
    """Questions that will not be answered now: once committed, tell the tools that asked them
    (``runtime.run_cancellation.calls_abandoned``), so a remote task stops waiting."""
    seqs = [a.step_seq for a in approvals if a.kind == ApprovalKind.INPUT]
    if not seqs:
        return
    keys = list(
        LoopStep.objects.filter(run_id=run_id, seq__in=seqs).values_list(
            "idempotency_key", flat=True
        )
    )
    transaction.on_commit(functools.partial(calls_abandoned, run_id, keys))


def approvals_expire(*, limit: int = 200) -> int:
    """Time out pending approvals past their deadline (the reaper calls this)."""
    due = list(
        ActionApproval.objects.filter(
            status=ApprovalStatus.PENDING, expires_at__lt=timezone.now()
        ).values_list("id", flat=True)[:limit]
    )
    for approval_id in due:
        _expire_one(approval_id)
    return len(due)


@transaction.atomic
def _expire_one(approval_id: uuid.UUID) -> None:
    approval, run = _lock(approval_id)
    if approval.status != ApprovalStatus.PENDING:
        return
    approval.status, approval.decided_by, approval.decided_at = (
        ApprovalStatus.EXPIRED,
        "timeout",
        timezone.now(),
    )
    approval.save(update_fields=["status", "decided_by", "decided_at"])
    _abandon_questions(run.id, [approval])
    _rewrite_step(
        approval,
        arguments=None,
        content="The approval request timed out before anyone decided; the call was not executed.",
    )
    if run.status != RunStatus.WAITING_APPROVAL:
        return
    on_timeout = (run.policy_snapshot.get("approvals") or {}).get("onTimeout", "reject")
    if on_timeout == "escalate":
        run_transition(
            run_id=run.id,
            to=RunStatus.WAITING_HUMAN,
            actor="timeout",
            event_type="approval.expired",
            data={"approval": str(approval.id), "then": "escalate"},
            fields={
                "terminal_reason": "approval_timeout",
                "failure_reason": (
                    f"Nobody decided on the approval of {approval.tool_name!r} in time; the "
                    "pattern's policy escalates expired approvals to a human."
                ),
            },
        )
        return
    run_event_append(
        run_id=run.id, type="approval.expired", actor="timeout", data={"approval": str(approval.id)}
    )
    _resume_if_settled(run, "timeout")

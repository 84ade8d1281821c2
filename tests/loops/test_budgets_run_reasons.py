"""Every run that ends, or waits for a human, says why (docs/runs.md): the engine's
conclusions, the human actions, expired approvals, and the fallback of ``run_transition``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from loops.models import ActionApproval, LoopRun, LoopStep, RunStatus, StepStatus
from loops.services.approvals import approvals_expire
from loops.services.endings import run_transition
from loops.services.runs import run_act
from loops.services.transitions import REASONED
from loops.worker.engine import _conclude_invocation, load_run_state
from loops.worker.verdicts import conclude_verdict
from runtime.invocation import InvocationOutcome, LoopRole, OutcomeKind
from tests.support.factories import make_pattern, make_run
from tests.support.limits import running_run, snapshot

PASS = {"verdict": "pass", "reasons": ["looks right"], "checks": []}


def reasons(run: LoopRun) -> tuple[str, str, str]:
    run.refresh_from_db()
    return run.status, run.terminal_reason, run.failure_reason


@pytest.mark.django_db
@pytest.mark.parametrize("target", sorted(REASONED))
def test_a_transition_that_stops_a_run_without_a_reason_records_its_event_type(
    target: RunStatus,
) -> None:
    run = make_run(status=RunStatus.RUNNING)
    run_transition(run_id=run.id, to=target, actor="t", event_type="some.path")
    assert reasons(run)[1] == "some_path"


@pytest.mark.django_db
def test_a_pass_at_l1_is_verified_and_at_l2_waits_for_acceptance() -> None:
    l1, lease = running_run()
    conclude_verdict(lease, load_run_state(l1.id), PASS)
    assert reasons(l1) == ("succeeded", "verified", "")
    l2, lease = running_run()
    LoopRun.objects.filter(pk=l2.id).update(autonomy_level="L2")
    conclude_verdict(lease, load_run_state(l2.id), PASS)
    status, code, text = reasons(l2)
    assert (status, code) == ("waiting_human", "awaiting_acceptance")
    assert "L2 needs a human to accept it" in text
    run_act(run_id=l2.id, action="accept", actor="ann")
    assert reasons(l2) == ("succeeded", "accepted", "")


@pytest.mark.django_db
def test_an_escalating_or_incomplete_verdict_names_its_problems() -> None:
    run, lease = running_run(policy={"requiredChecks": ["tests"]})
    conclude_verdict(lease, load_run_state(run.id), PASS)
    status, code, text = reasons(run)
    assert (status, code) == ("waiting_human", "escalated_by_verifier")
    assert "required check 'tests' is missing" in text and "looks right" in text


@pytest.mark.django_db
def test_a_rejection_fails_the_run_with_the_verifiers_reasons() -> None:
    run, lease = running_run()
    verdict = {"verdict": "reject", "reasons": ["broke the build"], "checks": []}
    conclude_verdict(lease, load_run_state(run.id), verdict)
    assert reasons(run) == ("failed", "rejected_by_verifier", "broke the build")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("kind", "code", "expected"),
    [
        (OutcomeKind.FAILED, "", ("failed", "error")),
        (OutcomeKind.FAILED, "unknown_employee", ("failed", "unknown_employee")),
        (OutcomeKind.BLOCKED, "", ("blocked", "blocked")),
        (OutcomeKind.ESCALATE, "", ("waiting_human", "escalated")),
    ],
)
def test_an_invocation_outcome_records_its_code_or_a_default(
    kind: OutcomeKind, code: str, expected: tuple[str, str]
) -> None:
    run, lease = running_run()
    outcome = InvocationOutcome(kind=kind, code=code, reason="because")
    _conclude_invocation(lease, load_run_state(run.id), outcome, (LoopRole.MAKER, "maker:0", "m"))
    assert reasons(run) == (*expected, "because")


@pytest.mark.django_db
def test_human_actions_say_who_acted_and_resume_clears_the_reason() -> None:
    run, _ = running_run()
    run_act(run_id=run.id, action="pause", actor="ann", reason="lunch")
    assert reasons(run) == ("paused", "paused", "Paused by ann: lunch")
    run_act(run_id=run.id, action="resume", actor="ann")
    assert reasons(run) == ("queued", "", "")
    run_act(run_id=run.id, action="pause", actor="ann")
    run_act(run_id=run.id, action="escalate", actor="bob", reason="looks odd")
    assert reasons(run) == ("waiting_human", "escalated", "Escalated by bob: looks odd")
    run_act(run_id=run.id, action="cancel", actor="cid")
    assert reasons(run) == ("canceled", "canceled", "Canceled by cid")


@pytest.mark.django_db
def test_an_expired_approval_that_escalates_records_approval_timeout() -> None:
    policy = {"approvals": {"timeoutSeconds": 60, "onTimeout": "escalate"}}
    pattern = make_pattern(policy=policy)
    run = make_run(
        pattern, status=RunStatus.WAITING_APPROVAL, policy_snapshot=snapshot(policy), step_count=1
    )
    LoopStep.objects.create(
        run=run, seq=1, role="maker", invocation="maker:0", kind="tool", name="write",
        status=StepStatus.GATED, request={"arguments": {"path": "a"}},
    )  # fmt: skip
    ActionApproval.objects.create(
        run=run, step_seq=1, role="maker", invocation="maker:0", tool_name="write",
        proposal_hash="x", expires_at=timezone.now() - timedelta(seconds=1),
    )  # fmt: skip
    assert approvals_expire() == 1
    status, code, text = reasons(run)
    assert (status, code) == ("waiting_human", "approval_timeout")
    assert "approval of 'write' in time" in text

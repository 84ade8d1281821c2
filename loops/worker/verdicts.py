"""The end of a run the verifier judged: its verdict decides the run's terminal state."""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from loops.models import RunStatus
from loops.roles import judge_verdict
from loops.services.artifacts import run_artifacts
from loops.services.endings import run_transition
from loops.services.transitions import Lease


class JudgedRun(Protocol):
    """What a verdict needs of the engine's ``RunState``."""

    id: uuid.UUID
    cursor: dict[str, Any]
    policy: dict[str, Any]
    autonomy_level: str


def conclude_verdict(lease: Lease, run: JudgedRun, verdict: dict[str, Any]) -> None:
    """pass → succeeded (L1) or waiting_human (L2/L3); reject → failed; else escalate.

    Missing required checks and evidence that is not an artifact of this run make the verdict
    an escalation (``judge_verdict``)."""
    artifact_ids = {str(artifact["id"]) for artifact in run_artifacts(run.id)}
    value, problems = judge_verdict(
        verdict,
        required_checks=list(run.policy.get("requiredChecks", [])),
        run_artifact_ids=artifact_ids,
    )
    fields: dict[str, Any] = {
        "cursor": run.cursor,
        "result": {**verdict, "effective_verdict": value, "problems": problems},
    }
    given = verdict.get("reasons")
    reasons = "; ".join(str(r) for r in given) if isinstance(given, list) else ""
    if value == "pass" and run.autonomy_level == "L1":
        target, fields["terminal_reason"] = RunStatus.SUCCEEDED, "verified"
    elif value == "pass":
        target = RunStatus.WAITING_HUMAN
        fields.update(
            terminal_reason="awaiting_acceptance",
            failure_reason=(
                f"The verifier passed the result; autonomy level {run.autonomy_level} needs a "
                "human to accept it."
            ),
        )
    elif value == "reject":
        target = RunStatus.FAILED
        fields.update(terminal_reason="rejected_by_verifier", failure_reason=reasons or "rejected")
    else:
        target = RunStatus.WAITING_HUMAN
        why = "; ".join([*problems, *([reasons] if reasons else [])])
        fields.update(
            terminal_reason="escalated_by_verifier",
            failure_reason=f"The verification escalated to a human: {why or 'no reason given'}",
        )
    run_transition(
        run_id=lease.run_id,
        to=target,
        actor=lease.owner,
        lease=lease,
        event_type="verification.verdict",
        data={"verdict": verdict.get("verdict"), "effective": value, "problems": problems},
        fields=fields,
    )

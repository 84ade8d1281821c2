"""docs/reliability.md A1: two approves and a reject racing on every approval, over real HTTP.

Parked runs (real services, see ``park_directly``) each wait on one gated write. For every
approval three requests, each on its own HTTP connection and so its own server thread and
database connection, are released together: approve, approve, reject. Exactly one decision may
be recorded per approval, the two others get 409, and every run is re-queued exactly once
(one ``approval.resumed`` event). 100 approvals on PostgreSQL; 25 on SQLite, whose writers
queue on the database lock instead of row locks. With a worker, the e2e variant
(tests/e2e/test_approvals_e2e.py) checks that the tool runs iff the approve won.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from django.db import connection

from loops.models import ActionApproval, LoopEvent, LoopRun, LoopStep, RunStatus
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import api_token_create, user_ensure
from tests.support.approvals import (
    Decision,
    approval_pattern,
    park_directly,
    pending_approvals,
    race_decisions,
    response_text,
    write_call,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
    pytest.mark.timeout(1200),
]


def approvals_for_race() -> int:
    return 100 if connection.vendor == "postgresql" else 25


def test_racing_decisions_record_exactly_one_and_resume_each_run_once(live_server: Any) -> None:
    count = approvals_for_race()
    pattern = approval_pattern("race")
    runs = [park_directly(pattern, [write_call(f"r{i}.txt", f"content {i}")]) for i in range(count)]
    approvals = {pending_approvals(run)[0].id: run for run in runs}
    token = api_token_create(user=user_ensure(username="approver", roles=[Role.APPROVER]))

    outcomes = race_decisions(live_server.url, token, list(approvals))

    errors = [o for results in outcomes.values() for o in results if not isinstance(o, Decision)]
    assert errors == [], errors[:3]
    winners: Counter[str] = Counter()
    problems = []
    for approval_id, results in outcomes.items():
        codes = sorted(r.status for r in results)
        if codes != [200, 409, 409]:
            problems.append(f"{approval_id}: {[(r.decision, r.status) for r in results]}")
            continue
        [won] = [r for r in results if r.status == 200]
        winners[won.decision] += 1
        approval = ActionApproval.objects.get(pk=approval_id)
        expected = "approved" if won.decision == "approve" else "rejected"
        if approval.status != expected or won.body["status"] != expected:
            problems.append(f"{approval_id}: won by {won.decision}, recorded {approval.status}")
        for lost in (r for r in results if r.status == 409):
            if lost.body.get("current_status") != expected:
                problems.append(f"{approval_id}: a loser saw {lost.body}")
    assert problems == [], problems[:5]
    print(f"\n{count} approvals raced: winners {dict(winners)}")

    run_ids = [run.id for run in approvals.values()]
    decided = Counter(
        LoopEvent.objects.filter(
            run_id__in=run_ids, type__in=["approval.approved", "approval.rejected"]
        ).values_list("run_id", flat=True)
    )
    resumed = Counter(
        LoopEvent.objects.filter(run_id__in=run_ids, type="approval.resumed").values_list(
            "run_id", flat=True
        )
    )
    assert sorted(decided.values()) == [1] * count, "a decision was recorded twice"
    assert sorted(resumed.values()) == [1] * count, "a run was resumed twice (or never)"
    assert set(LoopRun.objects.filter(id__in=run_ids).values_list("status", flat=True)) == {
        RunStatus.QUEUED
    }
    for approval_id, run in approvals.items():
        approval = ActionApproval.objects.get(pk=approval_id)
        step = LoopStep.objects.get(run=run, seq=approval.step_seq)
        if approval.status == "approved":
            assert step.status == "approved" and step.idempotency_key.endswith(str(approval.id))
            assert approval.approved_hash == approval.proposal_hash
        else:
            assert step.status == "completed" and "Rejected by approver" in response_text(step)
            assert approval.approved_hash == ""

"""Approvals with a real worker process (docs/reliability.md A1, A2): the production AgentInvoker
drives the runs against a scripted model served over loopback HTTP, humans decide over real
HTTP (the live server), and the worker resumes the runs.

* A1: two approves and a reject race on every approval; afterwards the tool has run iff the
  approve won, exactly once, under a key naming the approval; no run resumed twice.
* A2: after an approval the model proposes other arguments: the approved call is the one that
  ran, the new proposal waits for its own decision; the audit finds no mismatch.
* A worker SIGKILLed while its runs wait for approval loses nothing: the parked runs hold no
  lease, their approvals stay pending, and after the decisions another worker resumes them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from loops.models import ActionApproval, LoopEvent, LoopRun, LoopStep, RunStatus
from loops.services.runs import run_trigger
from loops.services.workspaces import workspace_path
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import api_token_create, user_ensure
from tests.e2e.conftest import start_worker
from tests.support.approvals import (
    Decision,
    approval_pattern,
    audit_problems,
    http_reply,
    loopback_team,
    pending_approvals,
    race_decisions,
    response_text,
    write_call,
)
from tests.support.model_server import ModelServer
from tests.support.workers import WorkerProcess, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
    pytest.mark.timeout(900),
]
AGENT = {"LOOPWRIGHT_INVOKER": "loops.worker.invoker.AgentInvoker"}
WAIT = 240  # generous: the machine is shared and loaded; the assertions stay strict
TERMINAL = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELED, RunStatus.WAITING_HUMAN)


@pytest.fixture
def model() -> Iterator[ModelServer]:
    with ModelServer() as server:
        server.always(http_reply)
        yield server
    server.check()


@pytest.fixture
def team(model: ModelServer) -> Any:
    loopback_team(model.url, "approvals")
    return approval_pattern("approvals-e2e")


@pytest.fixture
def worker(tmp_path: Path, workers: list[WorkerProcess], team: Any) -> WorkerProcess:
    return start_worker(workers, tmp_path, "approvals", **AGENT)


def statuses(run_ids: list[Any]) -> list[str]:
    return list(LoopRun.objects.filter(id__in=run_ids).values_list("status", flat=True))


def wait_all(run_ids: list[Any], wanted: tuple[str, ...], worker: WorkerProcess) -> None:
    wait_for(
        lambda: len(run_ids) == len([s for s in statuses(run_ids) if s in wanted]),
        timeout=WAIT,
        interval=0.5,
        message=f"{statuses(run_ids)}\n{worker.log()[-4000:]}",
    )


def ledger_entry(step: LoopStep) -> dict[str, Any] | None:
    """The write tool's effect-ledger record for this step's idempotency key (worker's VAR_DIR)."""
    name = hashlib.sha256(step.idempotency_key.encode()).hexdigest() + ".json"
    path = Path(settings.VAR_DIR) / "tool-ledger" / name
    return json.loads(path.read_text()) if path.exists() else None


def test_racing_decisions_run_the_tool_iff_the_approve_won(
    worker: WorkerProcess, team: Any, live_server: Any
) -> None:
    count = 12 if connection.vendor == "postgresql" else 6
    runs = [
        run_trigger(
            pattern=team,
            actor="operator",
            inputs={"label": str(i), "rounds": [[list(write_call(f"w{i}.txt", f"content {i}"))]]},
        )
        for i in range(count)
    ]
    run_ids = [run.id for run in runs]
    wait_all(run_ids, (RunStatus.WAITING_APPROVAL,), worker)
    approvals = {run.id: pending_approvals(run)[0] for run in runs}
    token = api_token_create(user=user_ensure(username="approver", roles=[Role.APPROVER]))
    outcomes = race_decisions(live_server.url, token, [a.id for a in approvals.values()])
    errors = [r for rs in outcomes.values() for r in rs if not isinstance(r, Decision)]
    assert errors == []
    wait_all(run_ids, TERMINAL, worker)

    winners = []
    for i, run_id in enumerate(run_ids):
        mine = outcomes[approvals[run_id].id]
        assert sorted(r.status for r in mine) == [200, 409, 409], mine
        [won] = [r.decision for r in mine if r.status == 200]
        winners.append(won)
        approval = ActionApproval.objects.get(pk=approvals[run_id].id)
        step = LoopStep.objects.get(run_id=run_id, seq=approval.step_seq)
        target = workspace_path(run_id) / f"w{i}.txt"
        events = list(LoopEvent.objects.filter(run_id=run_id).values_list("type", flat=True))
        assert events.count("approval.resumed") == 1, events
        assert LoopRun.objects.get(pk=run_id).status == RunStatus.SUCCEEDED
        if won == "approve":
            assert approval.status == "approved" and step.status == "completed"
            assert target.read_text() == f"content {i}"
            assert approval.executed_hash == approval.approved_hash != ""
            entry = ledger_entry(step)
            assert entry is not None and entry["key"].endswith(f":approval:{approval.id}")
            assert entry["path"] == f"w{i}.txt"
        else:
            assert approval.status == "rejected" and approval.executed_hash == ""
            assert "Rejected by approver" in response_text(step)
            assert not target.exists() and ledger_entry(step) is None
        writes = LoopStep.objects.filter(run_id=run_id, kind="tool", name="write")
        assert writes.count() == 1  # one call, executed at most once
    print(f"\nwinners: {winners}")
    assert audit_problems() == []


def test_the_approved_call_runs_even_when_the_model_proposes_other_arguments_later(
    worker: WorkerProcess, team: Any, api_client_for: Any
) -> None:
    first, second = write_call("r.txt", "version 1"), write_call("r.txt", "version 2")
    run = run_trigger(
        pattern=team,
        actor="operator",
        inputs={"label": "reproposal", "rounds": [[list(first)], [list(second)]]},
    )
    wait_all([run.id], (RunStatus.WAITING_APPROVAL,), worker)
    approver = api_client_for("approver")
    [approval] = pending_approvals(run)
    assert approval.arguments == first[1]
    response = approver.post(
        f"/api/v1/approvals/{approval.id}/decide", {"decision": "approve"}, format="json"
    )
    assert response.status_code == 200, response.content
    wait_for(
        lambda: len(pending_approvals(run)) == 1 and pending_approvals(run)[0].id != approval.id,
        timeout=WAIT,
        interval=0.5,
        message=worker.log()[-4000:],
    )
    assert LoopRun.objects.get(pk=run.id).status == RunStatus.WAITING_APPROVAL
    [reproposal] = pending_approvals(run)
    assert reproposal.arguments == second[1]
    target = workspace_path(run.id) / "r.txt"
    assert target.read_text() == "version 1"  # the approved call ran; the new one waits
    approval.refresh_from_db()
    assert approval.executed_hash == approval.approved_hash == approval.proposal_hash

    response = approver.post(
        f"/api/v1/approvals/{reproposal.id}/decide",
        {"decision": "reject", "reason": "keep version 1"},
        format="json",
    )
    assert response.status_code == 200
    wait_all([run.id], TERMINAL, worker)
    assert LoopRun.objects.get(pk=run.id).status == RunStatus.SUCCEEDED
    assert target.read_text() == "version 1"
    steps = LoopStep.objects.filter(run=run, kind="tool", name="write").order_by("seq")
    assert [s.status for s in steps] == ["completed", "completed"]
    assert ledger_entry(steps[1]) is None  # the rejected re-proposal never reached the tool
    assert audit_problems() == []


def test_a_worker_killed_while_runs_wait_for_approval_loses_nothing(
    tmp_path: Path, workers: list[WorkerProcess], team: Any, api_client_for: Any
) -> None:
    first = start_worker(workers, tmp_path, "before-kill", **AGENT)
    runs = [
        run_trigger(
            pattern=team,
            actor="operator",
            inputs={"label": f"k{i}", "rounds": [[list(write_call(f"k{i}.txt", f"kept {i}"))]]},
        )
        for i in range(3)
    ]
    run_ids = [run.id for run in runs]
    wait_all(run_ids, (RunStatus.WAITING_APPROVAL,), first)
    parked = {run.id: pending_approvals(run) for run in runs}
    assert all(len(a) == 1 for a in parked.values())
    # Parked runs hold no worker: nothing for a kill to take with it.
    assert set(LoopRun.objects.filter(id__in=run_ids).values_list("lease_owner", flat=True)) == {
        None
    }
    first.kill()
    assert not first.alive()

    approver = api_client_for("approver")
    decisions = ["approve", "reject", "approve"]
    for run_id, decision in zip(run_ids, decisions, strict=True):
        [approval] = parked[run_id]
        response = approver.post(
            f"/api/v1/approvals/{approval.id}/decide", {"decision": decision}, format="json"
        )
        assert response.status_code == 200, response.content
    assert set(statuses(run_ids)) == {RunStatus.QUEUED}  # waiting for any worker

    second = start_worker(workers, tmp_path, "after-kill", **AGENT)
    wait_all(run_ids, TERMINAL, second)
    for i, (run_id, decision) in enumerate(zip(run_ids, decisions, strict=True)):
        assert LoopRun.objects.get(pk=run_id).status == RunStatus.SUCCEEDED
        approval = ActionApproval.objects.get(pk=parked[run_id][0].id)
        step = LoopStep.objects.get(run_id=run_id, seq=approval.step_seq)
        target = workspace_path(run_id) / f"k{i}.txt"
        if decision == "approve":
            assert target.read_text() == f"kept {i}"
            assert approval.executed_hash == approval.approved_hash != ""
            entry = ledger_entry(step)
            assert entry is not None and entry["key"].endswith(f":approval:{approval.id}")
        else:
            assert not target.exists() and approval.executed_hash == ""
        events = list(LoopEvent.objects.filter(run_id=run_id).values_list("type", flat=True))
        assert events.count("approval.resumed") == 1, events
        assert LoopStep.objects.filter(run_id=run_id, kind="tool", name="write").count() == 1
    assert audit_problems() == []


def test_a_long_parked_maker_resumes_from_its_checkpoint_with_its_whole_history(
    tmp_path: Path,
    workers: list[WorkerProcess],
    team: Any,
    model: ModelServer,
    api_client_for: Any,
) -> None:
    """A maker parked after 20 read steps keeps a conversation checkpoint (runtime/checkpoint.py);
    after the approval a worker resumes from it: the approved write runs once and the model's
    next request carries every earlier result, in order, as a full replay would."""
    from loops.models import ConversationCheckpoint
    from orchestrator.agents.models import Employee
    from tests.support.approvals import MAKER, role_of

    Employee.objects.filter(username=MAKER).update(max_steps=30)
    worker = start_worker(workers, tmp_path, "checkpoint", **AGENT)
    # Two read tools in turn, every call distinct: no repetition rule stops the history.
    reads = [
        [["read", {"path": f"missing-{i}.txt"}]] if i % 2 else [["list", {"path": f"d{i}"}]]
        for i in range(20)
    ]
    rounds = [*reads, [list(write_call("long.txt", "after twenty reads"))]]
    run = run_trigger(pattern=team, actor="operator", inputs={"label": "long", "rounds": rounds})
    wait_all([run.id], (RunStatus.WAITING_APPROVAL,), worker)
    [approval] = pending_approvals(run)
    [checkpoint] = ConversationCheckpoint.objects.filter(run=run)
    last_model = LoopStep.objects.filter(run=run, kind="model", invocation=checkpoint.invocation)
    assert checkpoint.upto_seq == last_model.order_by("-seq")[0].seq - 1 < approval.step_seq
    assert json.loads(checkpoint.state)["model_steps"] == 20

    response = api_client_for("approver").post(
        f"/api/v1/approvals/{approval.id}/decide", {"decision": "approve"}, format="json"
    )
    assert response.status_code == 200, response.content
    wait_all([run.id], TERMINAL, worker)
    assert LoopRun.objects.get(pk=run.id).status == RunStatus.SUCCEEDED
    assert (workspace_path(run.id) / "long.txt").read_text() == "after twenty reads"
    writes = LoopStep.objects.filter(run=run, kind="tool", name="write")
    assert [s.status for s in writes] == ["completed"]
    resumed = [r.body["messages"] for r in model.requests if role_of(r.body["messages"]) == "maker"]
    tool_results = [m for m in resumed[-1] if m.get("role") == "tool"]
    assert len(tool_results) == 21  # twenty reads and the write, from checkpoint and journal
    assert [m["tool_call_id"] for m in tool_results] == [
        c["id"]
        for m in resumed[-1]
        if m.get("role") == "assistant"
        for c in m.get("tool_calls") or []
    ]

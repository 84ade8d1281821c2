"""docs/reliability.md A2 (TOCTOU): what runs is what was approved, and nothing else.

An approval stores ``proposal_hash`` over (tool, canonical arguments, run, step, policy
version); the decision stores ``approved_hash`` over the arguments that will run, and the
execution stores ``executed_hash`` over what ran. Here 50 attempts to change, replay or stretch
an approval are made through the HTTP API and through the model, and all must be refused; then
an audit over every approval finds no executed call whose hash differs from its approved one,
and every executed gated call carries its approval id in the tool's idempotency key.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import time_machine
from rest_framework.test import APIClient

from loops.models import ActionApproval, LoopRun, LoopStep, RunStatus
from loops.services.approval_decisions import canonical_hash
from loops.services.approvals import approvals_expire
from loops.services.runs import run_act
from tests.runtime.test_loop_gating import PLAN, park_with_two_gated_calls, tools
from tests.support.approvals import (
    Engine,
    Executed,
    approval_pattern,
    audit_problems,
    park_inline,
    pending_approvals,
    write_call,
)
from tests.support.fake_model import ScriptedModel, invoke, last_tool_messages, make_invoker
from tests.support.fake_model import text as model_text

pytestmark = pytest.mark.django_db
EVIL = {"path": "evil.txt", "content": "rm -rf / # smuggled"}
REFUSED = {400, 401, 403, 404, 405, 409}


def decide(client: APIClient, approval_id: Any, decision: str = "approve", **body: Any) -> Any:
    return client.post(
        f"/api/v1/approvals/{approval_id}/decide", {"decision": decision, **body}, format="json"
    )


def effective_arguments(approval: ActionApproval) -> dict[str, Any]:
    return dict(
        approval.decided_input if approval.decided_input is not None else approval.arguments
    )


class Attempts:
    """A table of mutation attempts: each is refused (with an expected status) or it is not."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, bool, str]] = []

    def http(self, name: str, response: Any, expected: set[int]) -> None:
        code = response.status_code
        self.rows.append((name, code in expected and code in REFUSED, f"HTTP {code}"))

    def check(self, name: str, refused: bool, detail: str) -> None:
        self.rows.append((name, refused, detail))

    def failures(self) -> list[str]:
        return [f"{name}: {detail}" for name, refused, detail in self.rows if not refused]


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    return Engine(tmp_path / "ledger")


def approve_and_drive(engine: Engine, approver: APIClient, run: LoopRun) -> ActionApproval:
    [approval] = pending_approvals(run)
    assert decide(approver, approval.id).status_code == 200
    engine.drive(run.id)
    approval.refresh_from_db()
    return approval


def test_fifty_mutation_attempts_on_approvals_are_all_refused(
    engine: Engine, api_client_for: Callable[[str], APIClient]
) -> None:
    approver, admin = api_client_for("approver"), api_client_for("admin")
    pattern = approval_pattern("toctou")
    timed = approval_pattern("toctou-timed", policy={"approvals": {"timeoutSeconds": 60}})

    ok_run = park_inline(engine, pattern, [write_call("ok.txt", "approved content")])
    ok = approve_and_drive(engine, approver, ok_run)
    assert LoopRun.objects.get(pk=ok_run.id).status == RunStatus.SUCCEEDED
    other_run = park_inline(engine, pattern, [write_call("other.txt", "other content")])
    [other] = pending_approvals(other_run)
    canceled_run = park_inline(engine, pattern, [write_call("c.txt", "c")])
    run_act(run_id=canceled_run.id, action="cancel", actor="operator")
    paused_run = park_inline(engine, pattern, [write_call("p.txt", "p")])
    run_act(run_id=paused_run.id, action="pause", actor="operator")
    expired_run = park_inline(engine, timed, [write_call("e.txt", "e")])
    [expired] = pending_approvals(expired_run)
    assert expired.expires_at is not None
    with time_machine.travel(expired.expires_at + timedelta(seconds=1), tick=False):
        assert approvals_expire() == 1
    v1, v2 = write_call("r.txt", "version 1"), write_call("r.txt", "version 2")
    reprop_run = park_inline(engine, pattern, [v1], [v2])
    reprop_first = approve_and_drive(engine, approver, reprop_run)
    same = write_call("s.txt", "same both times")
    same_run = park_inline(engine, pattern, [same], [same])
    same_first = approve_and_drive(engine, approver, same_run)
    before = {a.id: (a.status, a.arguments, a.approved_hash) for a in ActionApproval.objects.all()}

    attempts = Attempts()
    # 1-30: the approval row is not writable through the API, by anyone.
    personas = {p: api_client_for(p) for p in ("approver", "admin", "operator", "viewer")}
    for target in (ok, other):
        url = f"/api/v1/approvals/{target.id}"
        body = {"arguments": EVIL, "status": "approved", "decided_input": EVIL}
        for persona, client in personas.items():
            attempts.http(
                f"PATCH {persona} {target.status}", client.patch(url, body, format="json"), {405}
            )
            attempts.http(
                f"PUT {persona} {target.status}", client.put(url, body, format="json"), {405}
            )
            attempts.http(f"DELETE {persona} {target.status}", client.delete(url), {405})
    for persona, code in (("anonymous", 401), ("outsider", 403)):
        client = api_client_for(persona)
        url = f"/api/v1/approvals/{other.id}"
        attempts.http(
            f"PATCH {persona}", client.patch(url, {"arguments": EVIL}, format="json"), {code}
        )
        attempts.http(f"PUT {persona}", client.put(url, {"arguments": EVIL}, format="json"), {code})
        attempts.http(f"DELETE {persona}", client.delete(url), {code})
    # 31-34: nor are the run and its steps (the steps hold the approved arguments).
    forged = {
        "run": str(other_run.id),
        "step_seq": other.step_seq,
        "tool_name": "write",
        "arguments": EVIL,
    }
    attempts.http(
        "POST a forged approval", admin.post("/api/v1/approvals", forged, format="json"), {405}
    )
    run_url = f"/api/v1/runs/{other_run.id}"
    attempts.http(
        "PATCH the run", admin.patch(run_url, {"cursor": {"evil": True}}, format="json"), {405}
    )
    attempts.http("DELETE the run", admin.delete(run_url), {405})
    attempts.http(
        "PATCH the run's steps",
        admin.patch(
            f"{run_url}/steps",
            [{"seq": other.step_seq, "request": {"arguments": EVIL}}],
            format="json",
        ),
        {405},
    )
    # 35-37: editing the arguments after the approval: deciding again.
    attempts.http("approve again, edited", decide(approver, ok.id, input=EVIL), {409})
    attempts.http("reject after approval", decide(approver, ok.id, "reject"), {409})
    attempts.http("approve again, admin", decide(admin, ok.id), {409})
    # 38-42: input that is not this tool's call.
    edit_args = {"path": "other.txt", "old_text": "other", "new_text": "evil"}
    attempts.http("input for edit's schema", decide(approver, other.id, input=edit_args), {400})
    attempts.http(
        "input for read's schema", decide(approver, other.id, input={"path": "other.txt"}), {400}
    )
    smuggled = {**other.arguments, "mode": "append", "shell": "id"}
    attempts.http("input with smuggled keys", decide(approver, other.id, input=smuggled), {400})
    attempts.http("input as a list", decide(approver, other.id, input=[EVIL]), {400})
    attempts.http("input as a string", decide(approver, other.id, input="write evil.txt"), {400})
    # 43: replaying an (executed) approval id for another run's pending call: the fields that
    # would name the other call are refused as unknown (400) before the decided state (409).
    replay: dict[str, Any] = {
        "run": str(other_run.id),
        "step_seq": other.step_seq,
        "approval": str(other.id),
        "input": EVIL,
    }
    attempts.http("replay for another run's call", decide(approver, ok.id, **replay), {400})
    # 44-46: approving where the run no longer waits.
    [canceled] = ActionApproval.objects.filter(run=canceled_run)
    [paused] = ActionApproval.objects.filter(run=paused_run)
    attempts.http("approve after the run was canceled", decide(approver, canceled.id), {409})
    attempts.http("approve while the run is paused", decide(approver, paused.id), {409})
    attempts.http("approve after the approval expired", decide(approver, expired.id), {409})
    # 47: the model re-proposes other arguments after the approval.
    writes = [e.arguments for e in engine.writes_of(reprop_run.id)]
    [reproposal] = pending_approvals(reprop_run)
    attempts.check(
        "model re-proposes other arguments",
        writes == [v1[1]] and reproposal.arguments == v2[1] and reprop_first.arguments == v1[1],
        f"executed {writes}; pending {reproposal.arguments}",
    )
    # 48: the model repeats the approved call: a new call, a new approval, not a free pass.
    writes = [e.arguments for e in engine.writes_of(same_run.id)]
    repeated = pending_approvals(same_run)
    attempts.check(
        "model repeats the approved call",
        writes == [same[1]]
        and [a.arguments for a in repeated] == [same[1]]
        and repeated[0].id != same_first.id,
        f"executed {writes}; pending {[a.id for a in repeated]}",
    )
    # 49-50: approval ids that do not exist.
    attempts.http("unknown approval id", decide(approver, uuid.uuid4()), {404})
    attempts.http("malformed approval id", decide(approver, "1 OR 1=1"), {400, 404})

    assert len(attempts.rows) == 50
    assert attempts.failures() == []
    # Nothing that was refused changed anything.
    after = {a.id: (a.status, a.arguments, a.approved_hash) for a in ActionApproval.objects.all()}
    assert {k: after[k] for k in before} == before
    other_step = LoopStep.objects.get(run=other_run, seq=other.step_seq)
    assert other_step.status == "gated" and other_step.request["arguments"] == other.arguments
    assert_executed_calls_are_the_approved_ones(engine.executed)


def assert_executed_calls_are_the_approved_ones(executed: list[Executed]) -> None:
    """The audit: hashes agree, and every executed write is an approved call run under a key
    naming its approval."""
    assert audit_problems() == []
    writes = [e for e in executed if e.tool == "write"]
    assert writes, "nothing was executed: the audit would be vacuous"
    for call in writes:
        run_id = uuid.UUID(Path(call.workdir or "").name)
        approval_id = call.idempotency_key.rsplit(":approval:", 1)[-1]
        approval = ActionApproval.objects.get(pk=approval_id, run_id=run_id)
        assert approval.status == "approved"
        assert effective_arguments(approval) == call.arguments
        assert (
            approval.executed_hash
            == approval.approved_hash
            == canonical_hash(
                "write", call.arguments, str(run_id), approval.step_seq, approval.policy_version
            )
        )


def test_an_approved_call_whose_arguments_change_before_it_runs_is_not_run(
    engine: Engine, api_client_for: Callable[[str], APIClient]
) -> None:
    """Between the decision and the execution the approved arguments live in the step row. If
    that row is changed (a bug, a restored backup, a hostile writer), the executor must refuse
    the call rather than run it and leave the mismatch for a later audit to find."""
    approver = api_client_for("approver")
    run = park_inline(engine, approval_pattern("tamper"), [write_call("t.txt", "approved")])
    [approval] = pending_approvals(run)
    assert decide(approver, approval.id).status_code == 200
    step = LoopStep.objects.get(run=run, seq=approval.step_seq)
    LoopStep.objects.filter(pk=step.pk).update(request={**step.request, "arguments": EVIL})
    engine.drive(run.id)
    executed = [e.arguments for e in engine.writes_of(run.id)]
    assert EVIL not in executed, "the altered arguments ran, though nobody approved them"
    approval.refresh_from_db()
    assert approval.executed_hash in ("", approval.approved_hash)
    assert audit_problems() == []


def test_cancelling_a_parked_run_withdraws_its_pending_approvals(
    engine: Engine, api_client_for: Callable[[str], APIClient]
) -> None:
    """An approval that can only ever answer 409 must not stay in the approvers' queue."""
    run = park_inline(engine, approval_pattern("withdrawn"), [write_call("w.txt", "w")])
    run_act(run_id=run.id, action="cancel", actor="operator", reason="not needed")
    queue = api_client_for("approver").get("/api/v1/approvals?status=pending").json()["results"]
    assert [a for a in queue if a["run"] == str(run.id)] == []


def test_the_executor_asks_the_journal_before_an_approved_call_runs() -> None:
    """The same check without a database: the tool loop authorizes every approved call with
    its journal right before running it, and runs nothing the journal refuses."""
    journal, _, _, gated = park_with_two_gated_calls()
    kept, tampered = gated
    journal.approve(kept["seq"])
    journal.approve(tampered["seq"])
    journal.step(tampered["seq"]).request["arguments"] = {"path": "b.txt", "content": "evil"}
    read, write = tools()
    model = ScriptedModel(model_text("done"))
    invoke(make_invoker(model, [read, write], PLAN), journal)
    assert write.finished == [{"path": "a.txt", "content": "A"}]
    assert [seq for seq, refusal in journal.authorizations if refusal] == [tampered["seq"]]
    assert "differs from the one approved" in last_tool_messages(model.requests[0])[2]
    assert journal.step(tampered["seq"]).status == "failed"

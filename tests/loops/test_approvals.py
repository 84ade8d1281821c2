"""Approvals through the real services (docs/approvals.md): a gated call parks the run and
opens an approval bound to that call; one decision per approval (approve, approve with edited
input validated against the tool's schema and re-checked against the run's snapshot, reject);
the run goes on only when every gated call of it is decided; approvers or the pattern's listed
approvers decide; timeouts; notifications.

Runs are parked by the real engine (``drive_run``) and tool loop in this process, with the
production role policy and builtin file tools, and a scripted model (``tests.support.approvals``).
Decisions go through the HTTP API as the personas of ``tests/conftest.py``, on both paths of the
decision's write (``tests.support.write_paths``: batched on PostgreSQL, or statement by statement).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import urlparse

import pytest
import time_machine
from django.apps import apps as django_apps
from django.conf import settings
from django.db import transaction
from django.test import override_settings
from django.urls import Resolver404, resolve
from django.utils import timezone
from rest_framework.test import APIClient

from loops import db
from loops.models import ActionApproval, LoopEvent, LoopPattern, LoopRun, LoopStep, RunStatus
from loops.services.approval_decisions import canonical_hash
from loops.services.approvals import approvals_expire, approvals_open
from loops.services.notifications import deliver_approval_notifications
from loops.services.transitions import Lease
from loops.services.workspaces import workspace_path
from orchestrator.sql import is_postgres
from tests.support.approvals import (
    MAKER,
    Engine,
    approval_pattern,
    event_types,
    park_directly,
    park_inline,
    pending_approvals,
    response_text,
    tool_results,
    webhook_receiver,
    write_call,
)
from tests.support.write_paths import FAST, both_write_paths

pytestmark = pytest.mark.django_db
TIMED_OUT = "The approval request timed out before anyone decided; the call was not executed."


@pytest.fixture
def engine(tmp_path: Path, db: None) -> Engine:
    """The engine, with the seed migration's harness profiles (a transactional test's flush
    deletes them; the seed is idempotent)."""
    importlib.import_module("harness.migrations.0002_seed_profiles").seed(django_apps, None)
    return Engine(tmp_path / "ledger")


@pytest.fixture
def pattern(db: None) -> LoopPattern:
    return approval_pattern("approvals")


@pytest.fixture
def approver(api_client_for: Callable[[str], APIClient]) -> APIClient:
    return api_client_for("approver")


def decide(
    client: APIClient, approval: ActionApproval, decision: str = "approve", **body: Any
) -> Any:
    return client.post(
        f"/api/v1/approvals/{approval.id}/decide", {"decision": decision, **body}, format="json"
    )


def step_of(approval: ActionApproval) -> LoopStep:
    return LoopStep.objects.get(run_id=approval.run_id, seq=approval.step_seq)


def status_of(run: LoopRun) -> str:
    return str(LoopRun.objects.get(pk=run.id).status)


def forge_gated(run: LoopRun, *, role: str, tool: str, arguments: dict[str, Any]) -> ActionApproval:
    """A gated step and its approval for a call the loop itself would never gate (a denied
    tool, a write of the leader): opened with the real ``approvals_open`` on the parked run."""
    seq = LoopStep.objects.filter(run=run).count() + 100
    LoopStep.objects.create(
        run=run,
        seq=seq,
        role=role,
        invocation=f"forged-{role}",
        kind="tool",
        status="gated",
        name=tool,
        idempotency_key=f"{run.id}:{seq}:0",
        request={"arguments": arguments},
    )
    employee = run.role_bindings["leader"] if role == "leader" else MAKER
    [approval] = approvals_open(
        lease=Lease(run.id, "forger", 0),
        role=role,
        invocation=f"forged-{role}",
        employee=employee,
        gated=[{"seq": seq, "tool": tool, "arguments": arguments, "reason": "forged"}],
    )
    return approval


# --- parking -----------------------------------------------------------------------------------


def test_a_gated_write_parks_the_run_and_opens_an_approval_bound_to_the_call(
    engine: Engine, pattern: LoopPattern
) -> None:
    run = park_inline(engine, pattern, [write_call("notes.txt", "hello")])
    assert run.lease_owner is None  # parked: it holds no worker
    [approval] = pending_approvals(run)
    snapshot = run.harness_snapshots["makers"][MAKER]["profile"]
    policy_version = f"{snapshot['tag']}@{snapshot['version']}"
    assert (approval.tool_name, approval.arguments) == (
        "write",
        {"path": "notes.txt", "content": "hello"},
    )
    assert (approval.role, approval.invocation, approval.employee_username) == (
        "maker",
        "maker:0",
        MAKER,
    )
    assert approval.reason and approval.policy_version == policy_version == "default@1"
    assert approval.proposal_hash == canonical_hash(
        "write", approval.arguments, str(run.id), approval.step_seq, policy_version
    )
    assert approval.approved_hash == approval.executed_hash == "" and approval.expires_at is None
    step = step_of(approval)
    assert step.status == "gated" and step.idempotency_key.startswith(f"{run.id}:")
    assert ":approval:" not in step.idempotency_key
    assert event_types(run.id)[-1] == "approval.requested"
    assert engine.writes_of(run.id) == []
    assert not (workspace_path(run.id) / "notes.txt").exists()


# --- deciding ----------------------------------------------------------------------------------


@both_write_paths
def test_approving_requeues_the_run_and_runs_the_call_once_under_the_approval_key(
    engine: Engine, pattern: LoopPattern, approver: APIClient, write_path: str
) -> None:
    run = park_inline(engine, pattern, [write_call("notes.txt", "hello")])
    [approval] = pending_approvals(run)
    before = db.round_trips()
    response = decide(approver, approval, reason="looks right")
    assert response.status_code == 200, response.content
    # The batched path's two round trips (PostgreSQL); statement by statement otherwise.
    assert db.round_trips() - before == (2 if write_path == FAST and is_postgres() else 0)
    body = response.json()
    assert (body["status"], body["decided_by"], body["decision_reason"]) == (
        "approved",
        "approver",
        "looks right",
    )
    assert body["approved_hash"] == approval.proposal_hash  # nothing was edited
    assert status_of(run) == RunStatus.QUEUED
    assert event_types(run.id)[-2:] == ["approval.approved", "approval.resumed"]
    step = step_of(approval)
    assert step.status == "approved" and step.request["approval_id"] == str(approval.id)
    assert step.idempotency_key.endswith(f":approval:{approval.id}")

    assert engine.drive(run.id) == RunStatus.SUCCEEDED
    [executed] = engine.writes_of(run.id)
    assert executed.arguments == approval.arguments
    assert executed.idempotency_key == step.idempotency_key
    assert (workspace_path(run.id) / "notes.txt").read_text() == "hello"
    approval.refresh_from_db()
    assert approval.executed_hash == approval.approved_hash and approval.executed_at is not None
    assert step_of(approval).status == "completed"


@both_write_paths
def test_a_decision_on_a_run_a_worker_still_holds_takes_the_lease_away(
    engine: Engine, pattern: LoopPattern, approver: APIClient
) -> None:
    """A parked run holds no worker; one that does (a worker between its park and its release)
    is re-queued by the exact path, which bumps the fencing token (the batched one declines)."""
    run = park_inline(engine, pattern, [write_call("notes.txt", "hello")])
    [approval] = pending_approvals(run)
    held_until = timezone.now() + timedelta(minutes=5)
    LoopRun.objects.filter(pk=run.id).update(lease_owner="late-worker", lease_expires_at=held_until)
    token = LoopRun.objects.get(pk=run.id).lease_token
    assert decide(approver, approval).status_code == 200
    requeued = LoopRun.objects.get(pk=run.id)
    assert (requeued.status, requeued.lease_owner) == (RunStatus.QUEUED, None)
    assert requeued.lease_token == token + 1
    assert event_types(run.id)[-2:] == ["approval.approved", "approval.resumed"]


@both_write_paths
def test_an_approver_may_edit_the_input_and_the_edited_call_is_what_runs(
    engine: Engine, pattern: LoopPattern, approver: APIClient
) -> None:
    run = park_inline(engine, pattern, [write_call("notes.txt", "hello")])
    [approval] = pending_approvals(run)
    edited = {"path": "notes.txt", "content": "hello, reviewed"}
    response = decide(approver, approval, input=edited)
    assert response.status_code == 200, response.content
    approval.refresh_from_db()
    assert approval.decided_input == edited and approval.arguments["content"] == "hello"
    assert approval.approved_hash == canonical_hash(
        "write", edited, str(run.id), approval.step_seq, approval.policy_version
    )
    assert approval.approved_hash != approval.proposal_hash
    assert engine.drive(run.id) == RunStatus.SUCCEEDED
    assert [e.arguments for e in engine.writes_of(run.id)] == [edited]
    assert (workspace_path(run.id) / "notes.txt").read_text() == "hello, reviewed"
    approval.refresh_from_db()
    assert approval.executed_hash == approval.approved_hash


@both_write_paths
@pytest.mark.parametrize(
    "edited",
    [
        {"path": "notes.txt"},
        {"path": 3, "content": "x"},
        {"path": "notes.txt", "content": "x", "mode": "append"},
        {"path": "notes.txt", "old_text": "hello", "new_text": "bye"},
        ["notes.txt", "x"],
        "rm -rf /",
        42,
    ],
    ids=["missing", "wrong-type", "extra-key", "other-tools-schema", "list", "string", "number"],
)
def test_edited_input_must_fit_the_tools_schema(
    engine: Engine, pattern: LoopPattern, approver: APIClient, edited: Any
) -> None:
    run = park_inline(engine, pattern, [write_call("notes.txt", "hello")])
    [approval] = pending_approvals(run)
    response = decide(approver, approval, input=edited)
    assert response.status_code == 400, response.content
    assert response.json()["errors"][0]["pointer"].startswith("/input")
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.decided_by == ""
    assert status_of(run) == RunStatus.WAITING_APPROVAL and step_of(approval).status == "gated"


@both_write_paths
def test_a_gated_call_is_approved_not_answered_and_a_question_needs_an_answer(
    engine: Engine, pattern: LoopPattern, approver: APIClient
) -> None:
    run = park_inline(engine, pattern, [write_call("notes.txt", "hello")])
    [approval] = pending_approvals(run)
    response = decide(approver, approval, "answer", answer="blue")
    assert response.status_code == 400 and response.json()["errors"][0]["pointer"] == "/answer"
    ActionApproval.objects.filter(pk=approval.pk).update(kind="input", reason="Which colour?")
    for body in ({"answer": ""}, {"answer": None}, {}):
        response = decide(approver, approval, "answer", **body)
        assert response.status_code == 400, (body, response.content)
    rejected = decide(approver, approval, "reject", reason="not ours to say")
    assert rejected.status_code == 200 and rejected.json()["kind"] == "input"
    content = step_of(approval).response["content"]
    assert content.startswith("approver declined to answer the question (Which colour?)")
    assert status_of(run) == RunStatus.QUEUED


@both_write_paths
def test_a_call_the_runs_policy_denies_can_be_rejected_but_never_approved(
    engine: Engine, approver: APIClient
) -> None:
    # The maker's snapshot: edit denied by the pattern's harness layer, write asks.
    pattern = approval_pattern("deny-edit", policy={"harness": {"tools": {"deny": ["edit"]}}})
    run = park_inline(engine, pattern, [write_call("notes.txt", "hello")])
    [genuine] = pending_approvals(run)
    denied = forge_gated(
        run,
        role="maker",
        tool="edit",
        arguments={"path": "notes.txt", "old_text": "h", "new_text": "j"},
    )
    leader_write = forge_gated(
        run, role="leader", tool="write", arguments={"path": "plan.txt", "content": "x"}
    )
    unknown = forge_gated(run, role="maker", tool="shell", arguments={"cmd": "id"})
    for approval, why in ((denied, "denies"), (leader_write, "denies"), (unknown, "no longer")):
        response = decide(approver, approval)
        assert response.status_code == 409, (approval.tool_name, response.content)
        assert why in response.json()["detail"]
        approval.refresh_from_db()
        assert approval.status == "pending" and approval.approved_hash == ""
    for approval in (denied, leader_write, unknown):
        assert decide(approver, approval, "reject", reason="no").status_code == 200
    assert status_of(run) == RunStatus.WAITING_APPROVAL  # the genuine call is still undecided
    assert decide(approver, genuine).status_code == 200
    assert status_of(run) == RunStatus.QUEUED
    assert event_types(run.id).count("approval.resumed") == 1


@both_write_paths
def test_a_second_decision_is_a_conflict_and_changes_nothing(
    engine: Engine, pattern: LoopPattern, approver: APIClient, api_client_for: Any
) -> None:
    run = park_inline(engine, pattern, [write_call("notes.txt", "hello")])
    [approval] = pending_approvals(run)
    assert decide(approver, approval).status_code == 200
    approval.refresh_from_db()
    before = (approval.status, approval.decided_by, approval.decided_at, approval.approved_hash)
    admin = api_client_for("admin")
    attempts = [
        decide(approver, approval),
        decide(approver, approval, "reject", reason="changed my mind"),
        decide(admin, approval, input={"path": "notes.txt", "content": "other"}),
    ]
    assert [r.status_code for r in attempts] == [409, 409, 409]
    assert all(r.json()["current_status"] == "approved" for r in attempts)
    approval.refresh_from_db()
    assert (
        approval.status,
        approval.decided_by,
        approval.decided_at,
        approval.approved_hash,
    ) == before
    assert event_types(run.id).count("approval.approved") == 1
    assert event_types(run.id).count("approval.resumed") == 1


@both_write_paths
def test_several_gated_calls_open_one_approval_each_and_the_run_waits_for_the_last(
    engine: Engine, pattern: LoopPattern, approver: APIClient
) -> None:
    """The loop's side (results in the order the model made the calls, the approved call held
    back until its sibling is decided) is tested without a database in
    tests/runtime/test_loop_gating.py (test_resuming_runs_the_approved_call_once_and_gives_the_
    rejection_to_the_model); here the same step runs through the engine and the approvals."""
    run = park_inline(
        engine,
        pattern,
        [write_call("a.txt", "A"), ("list", {"path": "."}), write_call("b.txt", "B")],
    )
    first, second = pending_approvals(run)
    assert [a.arguments["path"] for a in (first, second)] == ["a.txt", "b.txt"]
    assert first.step_seq < second.step_seq and first.proposal_hash != second.proposal_hash
    assert [e.tool for e in engine.executed] == ["list"]  # the read ran before the park

    assert decide(approver, first).status_code == 200
    assert status_of(run) == RunStatus.WAITING_APPROVAL
    assert "approval.resumed" not in event_types(run.id)
    reason = "b.txt belongs to another team"
    assert decide(approver, second, "reject", reason=reason).status_code == 200
    assert status_of(run) == RunStatus.QUEUED
    assert event_types(run.id).count("approval.resumed") == 1

    assert engine.drive(run.id) == RunStatus.SUCCEEDED
    assert [(e.tool, e.arguments.get("path")) for e in engine.executed] == [
        ("list", "."),
        ("write", "a.txt"),
    ]
    resumed = engine.model.maker_requests()[-1]
    results = tool_results(resumed.messages)
    assert results[0] == "Wrote 1 bytes to a.txt."
    assert results[2] == f"Rejected by approver: {reason}. The call was not executed."
    assert not (workspace_path(run.id) / "b.txt").exists()


@both_write_paths
def test_only_approvers_or_the_patterns_listed_approvers_may_decide(
    engine: Engine, pattern: LoopPattern, api_client_for: Callable[[str], APIClient]
) -> None:
    listed = approval_pattern("listed", policy={"approvals": {"approvers": ["viewer"]}})
    plain_run = park_inline(engine, pattern, [write_call("a.txt", "A")])
    listed_run = park_inline(engine, listed, [write_call("b.txt", "B")])
    [plain] = pending_approvals(plain_run)
    [for_listed] = pending_approvals(listed_run)
    refused = {
        "anonymous": 401,
        "outsider": 403,
        "viewer": 403,  # listed for the other pattern only
        "operator": 403,
    }
    for persona, code in refused.items():
        response = decide(api_client_for(persona), plain)
        assert response.status_code == code, (persona, response.content)
    assert decide(api_client_for("operator"), for_listed).status_code == 403  # not listed
    plain.refresh_from_db()
    for_listed.refresh_from_db()
    assert plain.status == for_listed.status == "pending"

    assert decide(api_client_for("viewer"), for_listed).status_code == 200
    assert decide(api_client_for("approver"), plain, "reject").status_code == 200
    for_listed.refresh_from_db()
    plain.refresh_from_db()
    assert (for_listed.decided_by, plain.decided_by) == ("viewer", "approver")


# --- timeouts ------------------------------------------------------------------------------------


def expire_after_deadline(approval: ActionApproval) -> int:
    assert approval.expires_at is not None
    assert approvals_expire() == 0  # not before the deadline
    with time_machine.travel(approval.expires_at + timedelta(seconds=1), tick=False):
        return approvals_expire()


def test_a_timed_out_approval_reaches_the_model_as_a_timeout_never_as_a_human_refusal(
    engine: Engine, approver: APIClient
) -> None:
    pattern = approval_pattern(
        "times-out", policy={"approvals": {"timeoutSeconds": 60, "onTimeout": "reject"}}
    )
    run = park_inline(engine, pattern, [write_call("notes.txt", "hello")])
    [approval] = pending_approvals(run)
    assert approval.expires_at is not None
    assert (
        timedelta(seconds=55) < approval.expires_at - approval.created_at <= timedelta(seconds=61)
    )
    assert expire_after_deadline(approval) == 1
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("expired", "timeout")
    step = step_of(approval)
    assert step.status == "completed" and response_text(step) == TIMED_OUT
    assert status_of(run) == RunStatus.QUEUED
    assert event_types(run.id)[-2:] == ["approval.expired", "approval.resumed"]
    assert decide(approver, approval).status_code == 409  # too late

    assert engine.drive(run.id) == RunStatus.SUCCEEDED
    assert engine.writes_of(run.id) == []
    resumed = engine.model.maker_requests()[-1]
    assert tool_results(resumed.messages) == [TIMED_OUT]
    seen = " ".join(str(m.get("content")) for r in engine.model.requests for m in r.messages)
    assert "Rejected" not in seen and "denied" not in seen.lower()


def test_an_approval_timeout_can_escalate_the_run_to_a_human(
    engine: Engine, approver: APIClient
) -> None:
    pattern = approval_pattern(
        "escalates", policy={"approvals": {"timeoutSeconds": 30, "onTimeout": "escalate"}}
    )
    run = park_inline(engine, pattern, [write_call("notes.txt", "hello")])
    [approval] = pending_approvals(run)
    assert expire_after_deadline(approval) == 1
    assert status_of(run) == RunStatus.WAITING_HUMAN
    expired = LoopEvent.objects.filter(run=run, type="approval.expired").get()
    assert (expired.from_status, expired.to_status) == ("waiting_approval", "waiting_human")
    assert expired.data == {"approval": str(approval.id), "then": "escalate"}
    assert "approval.resumed" not in event_types(run.id)
    assert response_text(step_of(approval)) == TIMED_OUT
    assert decide(approver, approval).status_code == 409
    assert engine.writes_of(run.id) == []


# --- notifications -------------------------------------------------------------------------------


def with_webhook(url: str) -> Any:
    return override_settings(
        LOOPWRIGHT={**settings.LOOPWRIGHT, "APPROVAL_WEBHOOK_URL": url},
        PUBLIC_URL="https://loopwright.example.test",
    )


def test_the_webhook_gets_a_slack_compatible_message_with_a_deep_link(
    engine: Engine,
) -> None:
    pattern = approval_pattern("notified", policy={"approvals": {"timeoutSeconds": 600}})
    run = park_inline(engine, pattern, [write_call("notes.txt", "hello")])
    [approval] = pending_approvals(run)
    assert approval.expires_at is not None
    with webhook_receiver() as hook, with_webhook(hook.url):
        deliver_approval_notifications([str(approval.id)])
    [received] = hook.received
    assert received["path"] == "/hooks/approvals"
    assert received["headers"]["Content-Type"] == "application/json"
    message = received["json"]
    link = f"https://loopwright.example.test/approvals/{approval.id}"
    assert message["url"] == link
    assert isinstance(message["text"], str) and link in message["text"]
    for fragment in ("`write`", str(run.id), "maker", MAKER, approval.reason):
        assert fragment in message["text"], fragment
    assert message["approval"] == {
        "id": str(approval.id),
        "run": str(run.id),
        "tool": "write",
        "reason": approval.reason,
        "expires_at": approval.expires_at.isoformat(),
    }


def test_the_deep_link_of_a_notification_opens_a_page_of_the_ui(
    engine: Engine, pattern: LoopPattern
) -> None:
    """The link in the Slack text must lead somewhere: a route of the UI for the approval."""
    run = park_inline(engine, pattern, [write_call("notes.txt", "hello")])
    [approval] = pending_approvals(run)
    with webhook_receiver() as hook, with_webhook(hook.url):
        deliver_approval_notifications([str(approval.id)])
    path = urlparse(hook.received[0]["json"]["url"]).path
    try:
        match = resolve(path)
    except Resolver404:
        match = None
    assert match is not None, f"the notification links to {path}, which no route serves"
    assert match.namespace == "ui", match


def _notices(send_task: mock.MagicMock) -> list[list[str]]:
    """The approval ids of each ``loops.notify_approvals`` message sent to Celery."""
    return [
        c.kwargs["args"][0]
        for c in send_task.call_args_list
        if c.args == ("loops.notify_approvals",)
    ]


def test_notifications_are_queued_only_after_the_parking_transaction_commits(
    pattern: LoopPattern, django_capture_on_commit_callbacks: Any
) -> None:
    with (
        with_webhook("http://127.0.0.1:9/unused"),
        mock.patch("orchestrator.queue.app.send_task") as send,
    ):
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            run = park_directly(pattern, [write_call("a.txt", "A"), write_call("b.txt", "B")])
        ids = sorted(str(a.id) for a in pending_approvals(run))
        assert len(ids) == 2
        assert _notices(send) == []  # parked, committed by nobody yet: nothing announced
        for callback in callbacks:
            callback()
        [notified] = _notices(send)
        assert sorted(notified) == ids

        class Abort(Exception):
            pass

        with (
            django_capture_on_commit_callbacks(execute=True),
            pytest.raises(Abort),
            transaction.atomic(),
        ):
            park_directly(pattern, [write_call("c.txt", "C")])
            raise Abort
        assert len(_notices(send)) == 1  # the rolled-back park announced nothing
    with (
        mock.patch("orchestrator.queue.app.send_task") as unconfigured,
        django_capture_on_commit_callbacks(execute=True),
    ):
        park_directly(pattern, [write_call("d.txt", "D")])
    assert _notices(unconfigured) == []  # no webhook, no e-mail: nothing to queue

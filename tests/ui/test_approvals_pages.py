"""The Approvals pages of the UI (issue 8) through Django's test client: the queue across runs,
an approval's page (the notification's deep link), the decision form with edited arguments and
errors at the field, the inline forms on the run page, and role checks on the server.

Runs are parked through the real services (``park_directly``); decisions go through the real
``approval_decide``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from loops.models import ActionApproval, LoopPattern, LoopRun, RunStatus
from loops.services.runs import run_act
from tests.support.approvals import approval_pattern, park_directly, write_call

pytestmark = pytest.mark.django_db
ClientAs = Callable[[str], Client]


@pytest.fixture
def pattern() -> LoopPattern:
    return approval_pattern("ui-approvals")


def parked(pattern: LoopPattern, path: str = "notes.txt", content: str = "hello") -> Any:
    run = park_directly(pattern, [write_call(path, content)])
    return ActionApproval.objects.get(run=run)


def html(response: Any) -> str:
    return str(response.content.decode())


def decide(client: Client, approval: Any, **body: Any) -> Any:
    return client.post(f"/approvals/{approval.id}/decide", body)


def test_the_queue_lists_pending_approvals_oldest_first_with_their_context(
    pattern: LoopPattern, client_as: ClientAs
) -> None:
    first = parked(pattern, "a.txt", "first")
    second = parked(pattern, "b.txt", "second")
    page = html(client_as("viewer").get("/approvals"))
    assert page.index(f'id="approval-{first.id}"') < page.index(f'id="approval-{second.id}"')
    for fragment in (
        "write",
        "a.txt",
        "maker",
        first.reason,
        "Approvals test direct",  # the run's goal
        f'href="/runs/{first.run_id}"',
        f'href="/approvals/{first.id}"',
    ):
        assert fragment in page, fragment
    assert 'aria-current="page"' in page.split('href="/approvals"')[1][:30]  # the nav link


def test_the_queue_says_so_when_nothing_waits(client_as: ClientAs, db: None) -> None:
    page = html(client_as("approver").get("/approvals"))
    assert "Nothing is waiting for approval." in page


def test_the_notifications_deep_link_opens_the_approvals_page(
    pattern: LoopPattern, client_as: ClientAs
) -> None:
    approval = parked(pattern)
    page = html(client_as("approver").get(f"/approvals/{approval.id}"))
    assert "Approval of <code>write</code>" in page
    assert approval.reason in page and "Approvals test direct" in page
    assert 'name="decision" value="approve"' in page and 'name="decision" value="reject"' in page
    assert "&quot;content&quot;: &quot;hello&quot;" in page  # the arguments, editable


@pytest.mark.parametrize("value", ["not-a-uuid", "0190b5c4-0000-7000-8000-000000000000"])
def test_an_unknown_approval_is_a_404_page(value: str, client_as: ClientAs, db: None) -> None:
    response = client_as("viewer").get(f"/approvals/{value}")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


def test_a_viewer_sees_approvals_but_is_offered_no_decision_and_cannot_post_one(
    pattern: LoopPattern, client_as: ClientAs
) -> None:
    approval = parked(pattern)
    viewer = client_as("viewer")
    for path in ("/approvals", f"/approvals/{approval.id}", f"/runs/{approval.run_id}"):
        page = html(viewer.get(path))
        assert page.count("<form") == 1, path  # only the logout form
        assert "write" in page
    refused = decide(viewer, approval, decision="approve")
    assert refused.status_code == 403 and b"needs the approver role" in refused.content
    operator = decide(client_as("operator"), approval, decision="reject")
    assert operator.status_code == 403
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_an_approver_approves_with_edited_arguments_and_sees_who_decided(
    pattern: LoopPattern, client_as: ClientAs
) -> None:
    approval = parked(pattern)
    approver = client_as("approver")
    edited = {"path": "notes.txt", "content": "hello, reviewed"}
    response = decide(
        approver,
        approval,
        decision="approve",
        input=json.dumps(edited),
        reason="tone it down",
        next=f"/runs/{approval.run_id}",
    )
    assert response.status_code == 302 and response["Location"] == f"/runs/{approval.run_id}"
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by, approval.decided_input) == (
        "approved",
        "approver",
        edited,
    )
    assert LoopRun.objects.get(pk=approval.run_id).status == RunStatus.QUEUED
    page = html(approver.get(f"/approvals/{approval.id}"))
    assert re.search(r"by <strong[^>]*>approver</strong>", page)
    assert "tone it down" in page and "Approved with edited arguments" in page
    assert "<textarea" not in page  # decided: no form any more
    listed = html(approver.get("/approvals"))
    assert f'id="approval-{approval.id}"' in listed.split("Recent decisions")[1]


def test_unchanged_arguments_approve_the_call_as_proposed(
    pattern: LoopPattern, client_as: ClientAs
) -> None:
    approval = parked(pattern)
    typed = json.dumps(approval.arguments, indent=2)
    response = decide(client_as("approver"), approval, decision="approve", input=typed)
    assert response.status_code == 302
    approval.refresh_from_db()
    assert approval.status == "approved" and approval.decided_input is None
    assert approval.approved_hash == approval.proposal_hash


@pytest.mark.parametrize(
    ("typed", "message"),
    [
        ('{"path": "notes.txt", "content": ', "Not valid JSON"),
        ('["notes.txt"]', "Must be a JSON object"),
        ('{"path": "notes.txt"}', "&#x27;content&#x27; is a required property"),
        ('{"path": 3, "content": "x"}', "path: 3 is not of type"),
    ],
    ids=["malformed", "not-an-object", "missing-property", "wrong-type"],
)
def test_bad_edited_arguments_are_shown_at_the_field_and_nothing_is_decided(
    typed: str, message: str, pattern: LoopPattern, client_as: ClientAs
) -> None:
    approval = parked(pattern)
    response = decide(client_as("approver"), approval, decision="approve", input=typed)
    assert response.status_code == 400
    page = html(response)
    field = page.split('id="field-input"')[1].split("</div>")[0]
    assert "field-invalid" in page.split('id="field-input"')[0][-80:]
    assert message in field, field
    assert typed.replace('"', "&quot;")[:20] in field  # what was typed is kept
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_a_rejection_ignores_the_arguments_and_records_the_reason(
    pattern: LoopPattern, client_as: ClientAs
) -> None:
    approval = parked(pattern)
    response = decide(
        client_as("approver"), approval, decision="reject", input="{broken", reason="not today"
    )
    assert response.status_code == 302
    approval.refresh_from_db()
    assert (approval.status, approval.decision_reason) == ("rejected", "not today")


def test_the_run_page_offers_each_pending_approval_inline(
    pattern: LoopPattern, client_as: ClientAs
) -> None:
    run = park_directly(pattern, [write_call("a.txt", "A"), write_call("b.txt", "B")])
    first, second = ActionApproval.objects.filter(run=run).order_by("step_seq")
    approver = client_as("approver")
    page = html(approver.get(f"/runs/{run.id}"))
    for approval in (first, second):
        assert f'action="/approvals/{approval.id}/decide"' in page
        assert f'id="approval-{approval.id}-input"' in page  # ids do not collide
    assert f'name="next" value="/runs/{run.id}"' in page
    response = decide(approver, first, decision="reject", reason="no", next=f"/runs/{run.id}")
    assert response["Location"] == f"/runs/{run.id}"
    page = html(approver.get(f"/runs/{run.id}"))
    assert page.count('action="/approvals/') == 1  # only the second is still open
    assert f'id="inline-approval-{first.id}" data-status="rejected"' in page


def test_a_second_decision_is_refused_with_a_message_and_changes_nothing(
    pattern: LoopPattern, client_as: ClientAs
) -> None:
    approval = parked(pattern)
    approver = client_as("approver")
    assert decide(approver, approval, decision="reject", reason="first").status_code == 302
    response = decide(approver, approval, decision="approve")
    assert response.status_code == 302
    page = html(approver.get(response["Location"]))
    assert "already decided: rejected" in page
    approval.refresh_from_db()
    assert (approval.status, approval.decision_reason) == ("rejected", "first")


def test_a_canceled_runs_approval_leaves_the_queue_and_shows_as_withdrawn(
    pattern: LoopPattern, client_as: ClientAs
) -> None:
    approval = parked(pattern)
    run_act(run_id=approval.run_id, action="cancel", actor="operator", reason="not needed")
    approver = client_as("approver")
    queue = html(approver.get("/approvals"))
    assert "Nothing is waiting for approval." in queue
    page = html(approver.get(f"/approvals/{approval.id}"))
    assert "withdrawn" in page and "<textarea" not in page
    response = decide(approver, approval, decision="approve")
    assert "already decided: withdrawn" in html(approver.get(response["Location"]))
    approval.refresh_from_db()
    assert approval.status == "withdrawn" and approval.approved_hash == ""


def test_a_paused_runs_approval_waits_without_a_form(
    pattern: LoopPattern, client_as: ClientAs
) -> None:
    approval = parked(pattern)
    run_act(run_id=approval.run_id, action="pause", actor="operator")
    page = html(client_as("approver").get(f"/approvals/{approval.id}"))
    assert 'id="cannot-decide"' in page and "<textarea" not in page


def test_a_question_a_call_asked_is_answered_on_its_page(
    pattern: LoopPattern, client_as: ClientAs
) -> None:
    approval = parked(pattern)
    # A call that asked a question (a remote agent's input-required) waits like this.
    ActionApproval.objects.filter(pk=approval.pk).update(kind="input", reason="Which colour?")
    approver = client_as("approver")
    page = html(approver.get(f"/approvals/{approval.id}"))
    assert "The call that asks" in page and "Which colour?" in page
    assert 'name="decision" value="answer"' in page and 'value="approve"' not in page
    assert "Asks:" in html(approver.get("/approvals"))
    empty = decide(approver, approval, decision="answer", answer="  ")
    assert empty.status_code == 400
    assert "Write the answer to send, or reject the question." in html(empty)
    done = decide(approver, approval, decision="answer", answer="blue")
    assert done.status_code == 302
    approval.refresh_from_db()
    assert (approval.status, approval.answer, approval.decided_by) == (
        "approved",
        "blue",
        "approver",
    )
    step = LoopRun.objects.get(pk=approval.run_id).steps.get(seq=approval.step_seq)
    assert (step.status, step.request["answer"]) == ("approved", "blue")
    assert step.idempotency_key.endswith(f":approval:{approval.id}")
    assert "Answer: blue" in html(approver.get(f"/approvals/{approval.id}"))

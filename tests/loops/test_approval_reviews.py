"""The review of a gated skill call (docs/approvals.md), through the services and the API: the
approval captures the skill's interaction and review schemas when it opens; a decision needs a
review valid against that schema (a 400 naming the field otherwise), which is stored, returned
by the API and told to the model with the call's result or its rejection; an approval whose
tool asks no review refuses one; an edited input goes through the edited-input path."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from rest_framework.test import APIClient

from loops.models import ActionApproval, LoopStep, StepStatus
from loops.services.approvals import approval_authorize_reviewed
from loops.services.claims import run_claim
from tests.support.approvals import approval_pattern, park_directly, response_text, write_call
from tests.support.reviews import INTERACTION, PROMPT, REVIEW_SCHEMA, TOOL, reviewed_skill

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("seeded_profiles")]
ApiClientFor = Callable[[str], APIClient]


@pytest.fixture
def parked() -> ActionApproval:
    reviewed_skill()
    run = park_directly(approval_pattern("reviews"), [(TOOL, {"a": 2, "b": 3})], reason=PROMPT)
    return ActionApproval.objects.get(run=run)


def _decide(client: APIClient, approval: ActionApproval, **body: object) -> dict[str, object]:
    response = client.post(f"/api/v1/approvals/{approval.id}/decide", body, format="json")
    return {**response.json(), "http": response.status_code}


def test_the_approval_captures_the_skills_forms_and_the_api_returns_them(
    parked: ActionApproval, api_client_for: ApiClientFor
) -> None:
    assert (parked.interaction_schema, parked.review_schema, parked.review) == (
        INTERACTION, REVIEW_SCHEMA, None,
    )  # fmt: skip
    body = api_client_for("viewer").get(f"/api/v1/approvals/{parked.id}").json()
    assert (body["interaction_schema"], body["review_schema"], body["review"]) == (
        INTERACTION, REVIEW_SCHEMA, None,
    )  # fmt: skip


def test_a_decision_without_a_review_or_with_a_bad_one_is_refused_naming_the_field(
    parked: ActionApproval, api_client_for: ApiClientFor
) -> None:
    client = api_client_for("approver")
    for decision in ("approve", "reject"):
        missing = _decide(client, parked, decision=decision)
        assert missing["http"] == 400
        assert missing["errors"] == [  # type: ignore[comparison-overlap]
            {"pointer": "/review", "detail": "required", "code": "required"}
        ]
    bad = _decide(
        client, parked, decision="approve", review={"comment": "x" * 201, "checks": ["nope"]}
    )
    assert bad["http"] == 400
    errors = {e["pointer"]: e["code"] for e in bad["errors"]}  # type: ignore[attr-defined]
    assert errors == {
        "/review/verdict": "required", "/review/comment": "maxLength", "/review/checks/0": "enum",
    }  # fmt: skip
    assert "/review/" in str(bad["detail"])
    unknown = _decide(client, parked, decision="approve", review={"verdict": "ok", "x": 1})
    assert unknown["http"] == 400
    assert unknown["errors"][0]["code"] == "additionalProperties"  # type: ignore[index]
    parked.refresh_from_db()
    assert (parked.status, parked.review) == ("pending", None)


def test_an_approval_with_edited_input_and_a_review_stores_both_and_the_model_gets_it(
    parked: ActionApproval, api_client_for: ApiClientFor
) -> None:
    review = {"verdict": "ok", "checks": ["inputs"]}
    edited = {"a": 40, "b": 2}
    decided = _decide(
        api_client_for("approver"), parked, decision="approve", input=edited, review=review
    )
    assert decided["http"] == 200, decided
    assert (decided["http"], decided["review"], decided["decided_input"]) == (200, review, edited)
    step = LoopStep.objects.get(run_id=parked.run_id, seq=parked.step_seq)
    assert (step.status, step.request["arguments"]) == (StepStatus.APPROVED, edited)
    # The worker that runs the approved call gets the review with its authorization, and the
    # journal shows it to the model with the call's result.
    [claim] = run_claim(owner="review-test", lease_seconds=60, run_id=parked.run_id)
    assert approval_authorize_reviewed(
        claim.lease, seq=parked.step_seq, name=TOOL, arguments=edited
    ) == ("", 'Review by approver: {"checks": ["inputs"], "verdict": "ok"}')
    refused = approval_authorize_reviewed(
        claim.lease, seq=parked.step_seq, name=TOOL, arguments={"a": 2, "b": 3}
    )
    assert refused == (
        "The approved call was not run: its arguments differ from the approved ones.",
        "",
    )


def test_a_rejection_with_a_review_is_what_the_model_is_told(
    parked: ActionApproval, api_client_for: ApiClientFor
) -> None:
    review = {"verdict": "risky", "comment": "numbers too big"}
    decided = _decide(
        api_client_for("approver"), parked, decision="reject", reason="too big", review=review
    )
    assert (decided["http"], decided["review"]) == (200, review)
    step = LoopStep.objects.get(run_id=parked.run_id, seq=parked.step_seq)
    assert response_text(step) == (
        "Rejected by approver: too big. The call was not executed.\n"
        'Review by approver: {"comment": "numbers too big", "verdict": "risky"}'
    )


def test_an_edited_input_that_does_not_fit_the_tool_is_named_at_its_property(
    parked: ActionApproval, api_client_for: ApiClientFor
) -> None:
    refused = _decide(
        api_client_for("approver"), parked, decision="approve", input={"b": "x"},
        review={"verdict": "ok"},
    )  # fmt: skip
    assert refused["http"] == 400
    pointers = {e["pointer"] for e in refused["errors"]}  # type: ignore[attr-defined]
    assert pointers == {"/input/a", "/input/b"}


def test_a_review_on_an_approval_without_a_review_schema_is_refused_not_ignored(
    api_client_for: ApiClientFor,
) -> None:
    run = park_directly(approval_pattern("no-review"), [write_call("notes.txt", "hi")])
    approval = ActionApproval.objects.get(run=run)
    assert (approval.interaction_schema, approval.review_schema) == (None, None)
    client = api_client_for("approver")
    refused = _decide(client, approval, decision="approve", review={"verdict": "ok"})
    assert refused["http"] == 400
    assert refused["errors"] == [  # type: ignore[comparison-overlap]
        {"pointer": "/review", "detail": "no review schema", "code": "not_allowed"}
    ]
    assert _decide(client, approval, decision="approve")["http"] == 200

"""An approval of a reviewed skill's call on its page and on the run page: the call's arguments
as fields of the skill's interaction schema (prefilled), the review as fields of its review
schema; what is not of a field's type, and what the service refuses, is shown at the field;
a valid decision stores the edited input and the typed review, then both pages show it."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from django.test import Client

from loops.models import ActionApproval
from tests.support.approvals import approval_pattern, park_directly
from tests.support.reviews import TOOL, reviewed_skill

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("seeded_profiles")]
ClientAs = Callable[[str], Client]


@pytest.fixture
def parked() -> ActionApproval:
    reviewed_skill()
    run = park_directly(approval_pattern("review-pages"), [(TOOL, {"a": 2, "b": 3})])
    return ActionApproval.objects.get(run=run)


def _field(page: str, name: str) -> str:
    """The HTML of field ``name``, up to the next field or the end of its fieldset."""
    found = re.search(
        rf'<div class="field[^"]*" id="field-{name}".*?(?=<div class="field|</fieldset>\s*(?:<fieldset|<div class="field|</form))',
        page,
        re.DOTALL,
    )
    assert found, f"no field {name}"
    return found.group(0)


def test_the_page_shows_the_arguments_and_the_review_as_forms(
    client_as: ClientAs, parked: ActionApproval
) -> None:
    page = client_as("approver").get(f"/approvals/{parked.id}").content.decode()
    assert "<legend>Arguments</legend>" in page and "<legend>Review</legend>" in page
    assert 'name="input"' not in page  # the JSON textarea gives way to the fields
    first = _field(page, "arg__a")
    assert "First number" in first and 'type="number"' in first and 'value="2"' in first
    assert 'min="0"' in first and 'max="1000"' in first and 'step="1"' in first
    assert 'value="3"' in _field(page, "arg__b")
    verdict = _field(page, "review__verdict")
    assert "<select" in verdict and '<option value="ok">ok</option>' in verdict
    assert 'maxlength="200"' in _field(page, "review__comment")
    assert _field(page, "review__checks").count('type="checkbox"') == 2
    run_page = client_as("approver").get(f"/runs/{parked.run_id}").content.decode()
    assert f'id="approval-{parked.id}-review__verdict"' in run_page
    viewer = client_as("viewer").get(f"/approvals/{parked.id}").content.decode()
    assert "<legend>Review</legend>" not in viewer


def test_problems_are_shown_at_their_fields_and_a_valid_decision_is_stored_and_shown(
    client_as: ClientAs, parked: ActionApproval
) -> None:
    approver = client_as("approver")
    url = f"/approvals/{parked.id}/decide"
    typo = approver.post(url, {"decision": "approve", "arg__a": "two", "arg__b": "3"})
    assert typo.status_code == 400
    assert "Enter a whole number." in _field(typo.content.decode(), "arg__a")
    unreviewed = approver.post(url, {"decision": "approve", "arg__a": "2", "arg__b": "3"})
    assert unreviewed.status_code == 400
    assert "&#x27;verdict&#x27; is a required property" in _field(
        unreviewed.content.decode(), "review__verdict"
    )
    too_long = approver.post(
        url,
        {
            "decision": "approve",
            "arg__a": "2",
            "review__verdict": "ok",
            "review__comment": "x" * 201,
        },
    )
    assert too_long.status_code == 400
    assert "is too long" in _field(too_long.content.decode(), "review__comment")
    parked.refresh_from_db()
    assert parked.status == "pending"

    decided = approver.post(
        url,
        {"decision": "approve", "arg__a": "40", "arg__b": "3", "review__verdict": "ok",
         "review__comment": "small enough", "review__checks": ["limits", "inputs"], "reason": "fine"},
    )  # fmt: skip
    assert decided.status_code == 302
    parked.refresh_from_db()
    review = {"verdict": "ok", "comment": "small enough", "checks": ["inputs", "limits"]}
    assert (parked.status, parked.decided_input, parked.review) == (
        "approved", {"a": 40, "b": 3}, review,
    )  # fmt: skip
    for shown in (
        approver.get(f"/approvals/{parked.id}").content.decode(),
        approver.get(f"/runs/{parked.run_id}").content.decode(),
    ):
        assert 'class="approval-review"' in shown
        assert "<dt>comment</dt>" in shown and "small enough" in shown
        assert "inputs, limits" in shown


def test_an_untouched_argument_form_approves_the_call_as_proposed(
    client_as: ClientAs, parked: ActionApproval
) -> None:
    decided = client_as("approver").post(
        f"/approvals/{parked.id}/decide",
        {"decision": "approve", "arg__a": "2", "arg__b": "3", "review__verdict": "ok"},
    )
    assert decided.status_code == 302
    parked.refresh_from_db()
    assert (parked.status, parked.decided_input, parked.review) == (
        "approved", None, {"verdict": "ok", "checks": []},
    )  # fmt: skip


def test_the_queue_offers_no_quick_decision_for_a_call_that_needs_a_review(
    client_as: ClientAs, parked: ActionApproval
) -> None:
    page = client_as("approver").get("/approvals").content.decode()
    row = page[page.index(f'id="approval-{parked.id}"') :]
    row = row[: row.index("</tr>")]
    assert "queue-decide" not in row and ">Review</a>" in row

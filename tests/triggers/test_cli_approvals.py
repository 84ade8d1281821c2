"""``loopwright approvals``, ``approve`` and ``reject`` against a real server (pytest-django's
live_server): the pending calls are listed with their tool and arguments, a decision is
recorded as the API records it, and an unknown id is named."""

from __future__ import annotations

from typing import Any

import pytest

from loops.models import ActionApproval
from orchestrator import cli
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import api_token_create, user_ensure
from tests.support.approvals import approval_pattern, park_directly, write_call
from tests.support.reviews import TOOL, reviewed_skill

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("seeded_profiles")]


@pytest.fixture
def approver_cli(live_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    user = user_ensure(username="decider", roles=[Role.ADMIN])
    monkeypatch.setenv("LOOPWRIGHT_URL", live_server.url)
    monkeypatch.setenv("LOOPWRIGHT_TOKEN", api_token_create(user=user))


def test_pending_calls_are_listed_then_approved_and_rejected(
    approver_cli: None, capsys: pytest.CaptureFixture[str]
) -> None:
    pattern = approval_pattern("cli-decide")
    first = park_directly(pattern, [write_call("a.txt", "A")])
    second = park_directly(pattern, [write_call("b.txt", "B")])
    assert cli.main(["approvals"]) == 0
    listed = capsys.readouterr().out.splitlines()
    ids = {str(a.id): a for a in ActionApproval.objects.all()}
    assert len(listed) == 2 and all(line.split()[0] in ids for line in listed)
    assert any('"path": "a.txt"' in line and " write " in line for line in listed), listed

    [mine] = ActionApproval.objects.filter(run=first)
    assert cli.main(["approvals", "--run", str(first.id)]) == 0
    assert capsys.readouterr().out.split()[0] == str(mine.id)
    assert cli.main(["approve", str(mine.id), "--reason", "looks fine"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith(f"approval {mine.id} approved: ")
    [other] = ActionApproval.objects.filter(run=second)
    assert cli.main(["reject", str(other.id)]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith(f"approval {other.id} rejected: ")
    decided = {a.run_id: (a.status, a.decision_reason) for a in ActionApproval.objects.all()}
    assert decided == {first.id: ("approved", "looks fine"), second.id: ("rejected", "")}
    assert cli.main(["approvals"]) == 0
    assert capsys.readouterr().out.strip() == "no pending approvals"


def test_an_unknown_approval_is_named(
    approver_cli: None, live_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["approve", "0190c0de-0000-7000-8000-000000000000"]) == 1
    err = capsys.readouterr().err
    assert "argument ID: no approval and no run 0190c0de-0000-7000-8000-000000000000" in err


def test_a_reviewed_call_is_decided_with_a_review_and_a_bad_one_is_named(
    approver_cli: None, capsys: pytest.CaptureFixture[str]
) -> None:
    reviewed_skill()
    run = park_directly(approval_pattern("cli-review"), [(TOOL, {"a": 1, "b": 2})])
    [approval] = ActionApproval.objects.filter(run=run)
    assert cli.main(["approve", str(approval.id), "--review", '{"verdict": "maybe"}']) == 1
    assert "/review/verdict" in capsys.readouterr().err
    assert cli.main(["approve", str(approval.id), "--review", "{nope"]) == 1
    assert "--review is not JSON" in capsys.readouterr().err
    assert cli.main(["approve", str(approval.id), "--review", '{"verdict": "ok"}']) == 0
    approval.refresh_from_db()
    assert (approval.status, approval.review) == ("approved", {"verdict": "ok"})

"""An execution's sub-resources (events, their stream, downloads) read only their own
parameters: the executions list's filters neither show in their schema nor hide the execution,
and the ``after`` cursor is range-checked (400 naming it)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from rest_framework.test import APIClient

from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import user_ensure
from skillhub.models import Skill, SkillExecution
from skillhub.services.access import Caller
from skillhub.services.executions import execution_request

pytestmark = pytest.mark.django_db


@pytest.fixture
def execution(make_skill: Callable[..., Skill]) -> SkillExecution:
    caller = Caller.for_user(user_ensure(username="operator", roles=[Role.OPERATOR]))
    return execution_request(
        skill=make_skill(), inputs={"a": 1, "b": 2}, caller=caller, origin="api"
    )


def test_the_list_filters_do_not_hide_an_execution_from_its_events(
    api_client_for: Callable[[str], APIClient], execution: SkillExecution
) -> None:
    viewer = api_client_for("viewer")
    url = f"/api/v1/skill-executions/{execution.id}"
    odd = {"status": "succeeded", "skill": "nothing", "limit": "-1"}  # it is queued
    events = viewer.get(f"{url}/events", odd)
    assert events.status_code == 200, events.content
    assert [e["type"] for e in events.json()] == ["queued"]
    download = viewer.get(f"{url}/download", {**odd, "name": "none.txt"})
    assert download.status_code == 404 and "none.txt" in download.json()["detail"]


@pytest.mark.parametrize("after", ["-1", "x", "1" + "0" * 30])
def test_an_events_cursor_out_of_range_is_a_400_naming_it(
    api_client_for: Callable[[str], APIClient], execution: SkillExecution, after: str
) -> None:
    url = f"/api/v1/skill-executions/{execution.id}/events"
    response = api_client_for("viewer").get(url, {"after": after})
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["errors"][0]["pointer"] == "/after"

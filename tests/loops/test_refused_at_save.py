"""Input refused when it is saved, not when it is used, and writes that change nothing
recorded nowhere (issue 19), at the public edge: the REST API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from loops.cron import CronInvalid, CronSpec, cron_validate, unsupported_field
from loops.models import LoopEvent, LoopPattern
from loops.templates import MAX_GOAL_CHARS
from tests.support.limits import running_run

PROBLEM = "application/problem+json"
PATTERN = {
    "key": "nightly",
    "goal_template": "Tidy {{ inputs.get('path', 'docs') }}",
    "leader_username": "lead",
    "maker_usernames": ["maker"],
    "verifier_username": "checker",
}


@pytest.fixture
def operator(api_client_for: Callable[[str], APIClient]) -> APIClient:
    return api_client_for("operator")


def create(client: APIClient, **fields: Any) -> Any:
    return client.post("/api/v1/patterns", {**PATTERN, **fields}, format="json")


def pointers(response: Any) -> dict[str, str]:
    assert response.status_code == 400, response.content
    assert response["Content-Type"].startswith(PROBLEM)
    return {e["pointer"]: e["detail"] for e in response.json()["errors"]}


# --- goal templates ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_goal_template_longer_than_a_goal_may_be_is_refused_on_save(operator: APIClient) -> None:
    huge = "x" * (1024 * 1024)
    errors = pointers(create(operator, goal_template=huge))
    assert str(MAX_GOAL_CHARS) in errors["/goal_template"]
    assert not LoopPattern.objects.exists()

    assert create(operator, goal_template="y" * MAX_GOAL_CHARS).status_code == 201
    errors = pointers(
        operator.patch(
            "/api/v1/patterns/nightly", {"goal_template": "y" * (MAX_GOAL_CHARS + 1)}, format="json"
        )
    )
    assert "/goal_template" in errors
    assert LoopPattern.objects.get().goal_template == "y" * MAX_GOAL_CHARS
    trigger = operator.post("/api/v1/patterns/nightly/trigger", {"inputs": {}}, format="json")
    assert trigger.status_code == 201, trigger.content


# --- cron ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "field"),
    [
        ("H * * * *", "minute"),
        ("0 H(0-5) * * *", "hour"),
        ("0 0 * * H", "day-of-week"),
        ("*/5 * * * * R", "second"),
        ("0 0 1,H * *", "day-of-month"),
    ],
)
def test_hashed_and_random_fields_are_refused_naming_the_field(expression: str, field: str) -> None:
    problem = unsupported_field(expression)
    assert problem is not None and f"the {field} field" in problem
    with pytest.raises(CronInvalid, match=f"the {field} field"):
        cron_validate(CronSpec(expression, hash_id="nightly"))


@pytest.mark.parametrize("expression", ["0 9 * * thu", "0 0 * mar *", "@hourly", "0 0 L * *"])
def test_names_and_extensions_are_not_mistaken_for_hashes(expression: str) -> None:
    assert unsupported_field(expression) is None


@pytest.mark.django_db
def test_cron_the_scheduler_cannot_honour_is_refused_when_the_pattern_is_saved(
    operator: APIClient,
) -> None:
    cron = {"trigger_type": "cron", "timezone": "Europe/Paris"}
    errors = pointers(create(operator, cron_expression="H * * * *", **cron))
    assert "the minute field ('H') uses hashed values (H)" in errors["/cron_expression"]
    errors = pointers(create(operator, cron_expression="0 0 30 2 *", **cron))
    assert "never fires" in errors["/cron_expression"]
    errors = pointers(create(operator, cron_expression="H * * * *", **{**cron, "timezone": "Mars"}))
    assert set(errors) == {"/timezone", "/cron_expression"}
    assert not LoopPattern.objects.exists()
    assert create(operator, cron_expression="*/15 9-17 * * mon-fri", **cron).status_code == 201


# --- writes that change nothing ------------------------------------------------------------------


@pytest.mark.django_db
def test_a_budget_raise_that_changes_no_limit_writes_no_event(operator: APIClient) -> None:
    run, _ = running_run(policy={"budgets": {"perRun": {"toolCalls": 0, "cost": 0.5}}})
    url = f"/api/v1/runs/{run.id}/budget"
    for body in ({"toolCalls": 0}, {"toolCalls": 0, "cost": 0.5}):
        response = operator.post(url, {"perRun": body}, format="json")
        assert response.status_code == 200, response.content
        assert response.json()["budget_usage"]["perRun"]["toolCalls"]["limit"] == 0
    assert not LoopEvent.objects.filter(run=run, type="budget.raised").exists()

    response = operator.post(url, {"perRun": {"toolCalls": 0, "cost": 1}}, format="json")
    assert response.status_code == 200, response.content
    event = LoopEvent.objects.get(run=run, type="budget.raised")
    assert event.data == {"perRun": {"cost": {"from": 0.5, "to": 1.0}}}


@pytest.mark.django_db
def test_a_pattern_update_that_changes_nothing_keeps_its_version(operator: APIClient) -> None:
    created = create(operator).json()
    same = {k: created[k] for k in ("title", "goal_template", "maker_usernames", "enabled")}
    response = operator.patch("/api/v1/patterns/nightly", same, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["version"] == created["version"] == 1
    assert response.json()["updated_at"] == created["updated_at"]
    changed = operator.patch("/api/v1/patterns/nightly", {"title": "Tidy"}, format="json")
    assert changed.json()["version"] == 2

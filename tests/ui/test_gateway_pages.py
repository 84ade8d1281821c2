"""The Gateway page (test client, no browser): model aliases with their rules and employees, an
operator's create / replace / delete, and the daily quotas in force with today's usage."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import Client

from gateway.models import TokenUsageDay
from loops.models import UsageBucket
from loops.services import budget_rules
from loops.services.patterns import pattern_create
from orchestrator.accounts.models import ApiToken
from orchestrator.accounts.services import api_token_create, user_ensure
from orchestrator.agents.aliases import alias_create
from orchestrator.agents.models import Employee, EmployeeUsageDay, ModelAlias
from orchestrator.agents.services import employee_create, model_endpoint_create

pytestmark = pytest.mark.django_db
ClientAs = Callable[[str], Client]


def page(response: Any, status: int = 200) -> str:
    assert response.status_code == status, response.content[:2000]
    return str(response.content.decode())


@pytest.fixture
def routed() -> Employee:
    for name in ("offline", "spare"):
        model_endpoint_create(name=name, provider="scripted", script="demo")
    alias = alias_create(
        name="default-reasoning",
        actor="test",
        description="cheap makers",
        rules=[{"roles": ["maker"], "max_price_per_million_tokens": 5, "targets": ["spare"]}],
    )
    return employee_create(
        username="ada",
        endpoint=model_endpoint_create(name="own", provider="scripted", script="demo"),
        model_alias=alias,
        daily_token_quota=1000,
    )


def test_a_viewer_sees_aliases_and_the_quotas_used_today(
    client_as: ClientAs, routed: Employee
) -> None:
    today = datetime.now(UTC)
    EmployeeUsageDay.objects.create(username="ada", day=today.date(), tokens=250)
    owner = user_ensure(username="client", roles=[])
    api_token_create(user=owner, name="quota", daily_token_quota=100)
    token = ApiToken.objects.get(name="quota")
    TokenUsageDay.objects.create(token=token, day=today.date(), tokens=40)
    employee_create(username="vera", endpoint=routed.endpoint)
    pattern = pattern_create(
        key="nightly",
        actor="test",
        goal_template="Do it",
        leader_username="ada",
        verifier_username="vera",
        policy={
            "budgets": {"daily": {"tokens": 5000}},
            "contentSafety": {"output": [{"name": "words", "kind": "blocklist", "words": ["x"]}]},
        },
    )
    UsageBucket.objects.create(
        scope=budget_rules.daily_scope(pattern.pk, today), metric="tokens", value=1200
    )
    html = page(client_as("viewer").get("/gateway"))
    assert 'aria-current="page"' in html and "default-reasoning" in html
    assert "roles maker" in html and "at most 5" in html and "spare" in html
    assert 'href="/employees/ada"' in html
    assert "tokens 250 / 1,000" in html  # the employee's quota
    assert "tokens 1,200 / 5,000" in html  # the pattern's daily budget
    assert "0 input, 1 output rules" in html  # and its content safety
    assert "tokens 40 / 100" in html  # the API token's quota
    assert "Save alias" not in html  # a viewer does not write
    employee = page(client_as("viewer").get("/employees/ada"))
    assert "Model alias" in employee and "default-reasoning" in employee


def test_an_operator_creates_replaces_and_deletes_an_alias(
    client_as: ClientAs, routed: Employee
) -> None:
    client = client_as("operator")
    assert "Save alias" in page(client.get("/gateway"))
    rules = json.dumps([{"patterns": ["nightly-*"], "targets": ["offline", "spare"]}])
    made = client.post("/gateway", {"name": "nightly", "description": "", "rules": rules})
    assert made.status_code == 302
    assert ModelAlias.objects.get(name="nightly").rules[0]["targets"] == ["offline", "spare"]
    replaced = client.post("/gateway", {"name": "nightly", "rules": json.dumps([])})
    assert replaced.status_code == 302 and ModelAlias.objects.get(name="nightly").rules == []

    refused = page(client.post("/gateway", {"name": "x", "rules": '[{"targets": ["nope"]}]'}), 400)
    assert "0.targets.0: No model endpoint named nope." in refused
    assert "Not JSON" in page(client.post("/gateway", {"name": "x", "rules": "[{"}), 400)
    assert not ModelAlias.objects.filter(name="x").exists()

    in_use = client.post("/gateway/aliases/default-reasoning/delete", follow=True)
    assert "still used by: ada" in page(in_use)
    assert client.post("/gateway/aliases/nightly/delete").status_code == 302
    assert not ModelAlias.objects.filter(name="nightly").exists()

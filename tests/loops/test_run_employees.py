"""What a trigger reads: one statement for the token, its user and roles, one for the
employees (harness layers and the prompts to pin, sub-agents' included), one for every harness
profile the roles use."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from harness.services import profile_create
from instructions.services import instruction_create, instruction_publish
from loops.models import LoopRun
from loops.services.patterns import pattern_create
from loops.services.run_employees import run_employees_read
from orchestrator.accounts.models import ApiToken
from orchestrator.agents.models import Employee
from orchestrator.agents.services import (
    employee_create,
    model_endpoint_create,
    sub_agent_binding_create,
)

pytestmark = pytest.mark.django_db
MAKER_OWN = {"limits": {"recursionLimit": 5}}


@pytest.fixture
def team() -> dict[str, Employee]:
    endpoint = model_endpoint_create(name="offline", provider="scripted", script="demo")
    profile_create(tag="tight", settings={"limits": {"maxInvocations": 2}})
    for name in ("tone", "style"):
        instruction_create(name=name, text=f"The {name}.", created_by="test")
        instruction_publish(name=name, published_by="test")
    made = {
        "lead": employee_create(
            username="lead", endpoint=endpoint, system_prompt="Lead. ${instructions.tone}"
        ),
        "mk": employee_create(
            username="mk", endpoint=endpoint, harness_tag="safe", harness=MAKER_OWN,
            system_prompt="Maker.",
        ),
        "checker": employee_create(username="checker", endpoint=endpoint, system_prompt="Check."),
        "helper": employee_create(
            username="helper", endpoint=endpoint, harness_tag="safe",
            system_prompt="Helper. ${instructions.style}",
        ),
        "stranger": employee_create(
            username="stranger", endpoint=endpoint, system_prompt="${instructions.nope}"
        ),
    }  # fmt: skip
    sub_agent_binding_create(parent=made["lead"], child=made["helper"])
    pattern_create(
        key="reads",
        actor="test",
        goal_template="Tidy {{ inputs.get('what', 'docs') }}",
        leader_username="lead",
        maker_usernames=["mk"],
        verifier_username="checker",
        verifier_harness_tag="tight",
    )
    return made


def test_one_query_reads_the_roles_layers_and_every_prompt_to_pin(
    team: dict[str, Employee], django_assert_num_queries: Callable[..., Any]
) -> None:
    with django_assert_num_queries(1):
        read = run_employees_read(["lead", "mk", "checker", "gone"])
    # The sub-agent's prompt is pinned with the roles'; its layers are not a role's.
    assert read.layers == {"mk": ("safe", MAKER_OWN)}
    prompts = ["Lead. ${instructions.tone}", "Maker.", "Check.", "Helper. ${instructions.style}"]
    assert sorted(read.prompts) == sorted(prompts)


def test_a_trigger_reads_each_thing_once(
    team: dict[str, Employee], api_client_for: Callable[[str], APIClient]
) -> None:
    client = api_client_for("operator")
    ApiToken.objects.update(last_used_at=timezone.now())
    with CaptureQueriesContext(connection) as sent:
        response = client.post("/api/v1/patterns/reads/trigger", {"inputs": {}}, format="json")
    assert response.status_code == 201, response.content
    selects = [q["sql"] for q in sent.captured_queries if q["sql"].startswith("SELECT")]

    def reading(table: str) -> list[str]:
        return [sql for sql in selects if re.search(rf'FROM "?{table}"?\s', sql)]

    (token,) = reading("accounts_apitoken")
    assert reading("auth_user_groups") == [token] and not reading("auth_group")
    assert len(reading("agents_employee")) == len(reading("harness_harnessprofile")) == 1
    run = LoopRun.objects.get(pk=response.json()["id"])
    assert run.instruction_versions == {"tone": 1, "style": 1}
    snapshots = run.harness_snapshots
    assert snapshots["makers"]["mk"]["layers"][-2:] == ["employee:mk:profile:safe@1", "employee:mk"]
    assert snapshots["verifier"]["profile"] == {"tag": "tight", "version": 1}

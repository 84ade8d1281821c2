"""The five harness layers in real runs: the employee's profile and inline layers and the run's
overrides, through the trigger API, the harness preview and the generic compile API.

platform → profile:<tag>@<v> → pattern → employee:<u>:profile:<tag>@<v> → employee:<u> → run
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import include, path
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

from harness.services import profile_create, profile_delete
from loops.models import LoopEvent, LoopRun
from orchestrator.agents.models import Employee
from orchestrator.agents.services import employee_create, employee_update, model_endpoint_create

pytestmark = pytest.mark.django_db
PROBLEM = "application/problem+json"
TIGHT = {"limits": {"maxInvocations": 2, "recursionLimit": 8}}
MAKER_OWN = {"tools": {"deny": ["write"]}, "limits": {"recursionLimit": 5}}
PATTERN_LAYER = {"limits": {"maxToolCalls": 30}}
PATTERN = {
    "key": "layered",
    "goal_template": "Tidy {{ inputs.get('what', 'docs') }}",
    "leader_username": "lead",
    "maker_usernames": ["mk"],
    "verifier_username": "checker",
    "verifier_harness_tag": "tight",
    "policy": {"harness": PATTERN_LAYER},
}
Clients = Callable[[str], APIClient]


@pytest.fixture
def operator(api_client_for: Clients) -> APIClient:
    profile_create(tag="tight", settings=TIGHT)
    endpoint = model_endpoint_create(name="offline", provider="scripted", script="demo")
    employee_create(username="lead", endpoint=endpoint)
    employee_create(username="mk", endpoint=endpoint, harness_tag="tight", harness=MAKER_OWN)
    employee_create(username="checker", endpoint=endpoint)
    client = api_client_for("operator")
    response = client.post("/api/v1/patterns", PATTERN, format="json")
    assert response.status_code == 201, response.content
    return client


def trigger(client: APIClient, overrides: Any = None, **extra: Any) -> Any:
    body: dict[str, Any] = {"inputs": {}, **extra}
    if overrides is not None:
        body["harness_overrides"] = overrides
    return client.post("/api/v1/patterns/layered/trigger", body, format="json")


def triggered(client: APIClient, overrides: Any = None) -> dict[str, Any]:
    response = trigger(client, overrides)
    assert response.status_code == 201, response.content
    return dict(response.json())


def snapshots_of(run_id: str) -> dict[str, Any]:
    return dict(LoopRun.objects.get(pk=run_id).harness_snapshots)


def profile_name(snapshot: dict[str, Any]) -> str:
    return f"profile:{snapshot['profile']['tag']}@{snapshot['profile']['version']}"


def test_the_makers_own_layers_follow_the_pattern_in_its_snapshot(operator: APIClient) -> None:
    run = triggered(operator)
    snaps = snapshots_of(run["id"])
    maker = snaps["makers"]["mk"]
    assert maker["layers"] == [
        "platform",
        profile_name(maker),
        "pattern",
        "employee:mk:profile:tight@1",
        "employee:mk",
    ]
    assert maker["settings"]["limits"]["maxInvocations"] == 2
    assert maker["provenance"]["limits.maxInvocations"] == "employee:mk:profile:tight@1"
    assert maker["settings"]["limits"]["recursionLimit"] == 5
    assert maker["provenance"]["limits.recursionLimit"] == "employee:mk"
    assert "write" in maker["settings"]["tools"]["deny"]
    assert maker["provenance"]["tools.deny"] == "employee:mk"
    assert maker["provenance"]["limits.maxToolCalls"] == "pattern"
    # Employees without layers of their own get none; no run layer without overrides.
    assert snaps["leader"]["layers"] == ["platform", profile_name(snaps["leader"]), "pattern"]
    assert run["harness_notices"] == []
    created = LoopEvent.objects.get(run_id=run["id"], type="run.created")
    assert "harness_overrides" not in created.data


def test_an_override_that_loosens_gets_the_stricter_value_and_says_so(
    operator: APIClient,
) -> None:
    overrides = {"limits": {"maxInvocations": 20, "maxToolCalls": 3}}
    run = triggered(operator, overrides)
    snaps = snapshots_of(run["id"])
    maker, verifier, leader = snaps["makers"]["mk"], snaps["verifier"], snaps["leader"]
    # Tighter than every earlier layer: applied, and the run layer decided it.
    for snap in (leader, maker, verifier):
        assert snap["layers"][-1] == "run"
        assert snap["settings"]["limits"]["maxToolCalls"] == 3
        assert snap["provenance"]["limits.maxToolCalls"] == "run"
    # Looser: each role keeps the stricter value of the layer that set it, and is told.
    assert maker["settings"]["limits"]["maxInvocations"] == 2
    assert verifier["settings"]["limits"]["maxInvocations"] == 2
    assert verifier["provenance"]["limits.maxInvocations"] == "profile:tight@1"
    expected = [
        {"role": "maker", "employee": "mk", "field": "limits.maxInvocations", "asked": 20,
         "got": 2, "decidedBy": "employee:mk:profile:tight@1"},
        {"role": "verifier", "employee": "checker", "field": "limits.maxInvocations",
         "asked": 20, "got": 2, "decidedBy": "profile:tight@1"},
    ]  # fmt: skip
    leader_cap = leader["settings"]["limits"]["maxInvocations"]
    if leader_cap < 20:  # the leader's profile may be as strict as well
        expected.insert(
            0,
            {"role": "leader", "employee": "lead", "field": "limits.maxInvocations",
             "asked": 20, "got": leader_cap, "decidedBy": profile_name(leader)},
        )  # fmt: skip
    assert run["harness_notices"] == expected
    created = LoopEvent.objects.get(run_id=run["id"], type="run.created")
    assert created.data["overrides_not_applied"] == expected
    assert created.data["harness_overrides"] == overrides
    detail = operator.get(f"/api/v1/runs/{run['id']}").json()
    assert detail["harness_notices"] == expected


@pytest.mark.parametrize(
    ("overrides", "pointers"),
    [
        ({"limits": {"maxInvocations": "3"}}, {"/harness_overrides/limits/maxInvocations"}),
        ({"limits": {"maxInvocations": -1}}, {"/harness_overrides/limits/maxInvocations"}),
        ({"bogus": {}}, {"/harness_overrides/bogus"}),
        ({"tools": {"deny": "write"}, "limits": {"maxTokens": 1.5}},
         {"/harness_overrides/tools/deny", "/harness_overrides/limits/maxTokens"}),
        (["limits"], {"/harness_overrides"}),
    ],
)  # fmt: skip
def test_invalid_overrides_are_a_400_with_pointers_and_start_nothing(
    operator: APIClient, overrides: Any, pointers: set[str]
) -> None:
    response = trigger(operator, overrides)
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == PROBLEM
    assert {error["pointer"] for error in response.json()["errors"]} == pointers
    assert not LoopRun.objects.exists()


def test_null_overrides_are_refused_and_empty_ones_add_no_layer(operator: APIClient) -> None:
    response = trigger(operator, None, harness_overrides=None)
    assert response.status_code == 400
    assert [e["pointer"] for e in response.json()["errors"]] == ["/harness_overrides"]
    run = triggered(operator, {})
    assert "run" not in snapshots_of(run["id"])["leader"]["layers"]


def test_a_misspelt_overrides_field_is_refused_rather_than_ignored(operator: APIClient) -> None:
    response = trigger(operator, None, harness_override={"limits": {"maxInvocations": 1}})
    assert response.status_code == 400 and response["Content-Type"] == PROBLEM
    assert [e["pointer"] for e in response.json()["errors"]] == ["/harness_override"]
    assert not LoopRun.objects.exists()


def test_the_preview_equals_the_snapshot_byte_for_byte(
    operator: APIClient, api_client_for: Clients
) -> None:
    overrides = {"limits": {"maxInvocations": 20, "maxTokens": 9000}, "tools": {"ask": ["list"]}}
    preview = api_client_for("viewer").post(
        "/api/v1/patterns/layered/harness-preview", {"harness_overrides": overrides}, format="json"
    )
    assert preview.status_code == 200, preview.content
    run = triggered(operator, overrides)
    stored = LoopRun.objects.get(pk=run["id"]).harness_snapshots
    assert json.dumps(preview.json()["harness_snapshots"], sort_keys=True) == json.dumps(
        stored, sort_keys=True
    )
    assert preview.json()["harness_notices"] == run["harness_notices"] != []
    assert not LoopRun.objects.exclude(pk=run["id"]).exists(), "the preview started a run"


def test_the_roles_and_employees_profiles_are_read_in_one_query(operator: APIClient) -> None:
    with CaptureQueriesContext(connection) as sent:
        run = triggered(operator)
    sent_sql = [q["sql"].replace('"', "") for q in sent.captured_queries]
    reads = [sql for sql in sent_sql if "FROM harness_harnessprofile " in sql]
    assert len(reads) == 1
    snaps = snapshots_of(run["id"])
    assert (snaps["verifier"]["profile"], snaps["makers"]["mk"]["layers"][3]) == (
        {"tag": "tight", "version": 1},
        "employee:mk:profile:tight@1",
    )


def test_the_preview_refuses_invalid_overrides_like_the_trigger(operator: APIClient) -> None:
    response = operator.post(
        "/api/v1/patterns/layered/harness-preview",
        {"harness_overrides": {"limits": {"timeoutMs": True}}},
        format="json",
    )
    assert response.status_code == 400 and response["Content-Type"] == PROBLEM
    assert [e["pointer"] for e in response.json()["errors"]] == [
        "/harness_overrides/limits/timeoutMs"
    ]


def test_the_compile_api_with_the_same_layers_gives_the_roles_snapshot(
    operator: APIClient,
) -> None:
    # The compile API takes an employee's inline layer (not its profile tag): compare with a
    # maker that carries only inline settings.
    employee_update(employee=Employee.objects.get(username="mk"), harness_tag="")
    overrides = {"limits": {"maxInvocations": 4}, "isolation": {"networkAccess": "deny"}}
    run = triggered(operator, overrides)
    maker = snapshots_of(run["id"])["makers"]["mk"]
    body = {
        "tag": maker["profile"]["tag"],
        "pattern": PATTERN_LAYER,
        "employee": {"username": "mk", "harness": MAKER_OWN},
        "overrides": overrides,
    }
    compiled = operator.post("/api/v1/harness-profiles/compile", body, format="json")
    assert compiled.status_code == 200, compiled.content
    for key in ("profile", "settings", "provenance", "layers"):
        assert json.dumps(compiled.json()[key], sort_keys=True) == json.dumps(
            maker[key], sort_keys=True
        ), key
    assert maker["layers"] == ["platform", profile_name(maker), "pattern", "employee:mk", "run"]


def test_a_retry_runs_under_the_same_overrides(operator: APIClient) -> None:
    overrides = {"limits": {"maxInvocations": 20, "maxToolCalls": 3}}
    first = triggered(operator, overrides)
    assert operator.post(f"/api/v1/runs/{first['id']}/cancel", {}, format="json").status_code == 200
    retry = operator.post(f"/api/v1/runs/{first['id']}/retry", {}, format="json")
    assert retry.status_code == 201, retry.content
    assert snapshots_of(retry.json()["id"]) == snapshots_of(first["id"])
    assert retry.json()["harness_notices"] == first["harness_notices"] != []


def test_an_employee_whose_profile_is_gone_cannot_start_runs(operator: APIClient) -> None:
    profile_delete(tag="tight")
    response = trigger(operator)
    assert response.status_code == 400 and response["Content-Type"] == PROBLEM
    body = response.json()
    assert body["type"] == "/problems/unknown-harness-profile"
    assert "employee:mk" in body["detail"] and "tight" in body["detail"]
    assert not LoopRun.objects.exists()


def test_the_openapi_schema_documents_the_new_fields() -> None:
    GENERATOR_STATS.reset()
    schema = SchemaGenerator(patterns=[path("api/v1/", include("loops.urls"))]).get_schema(
        request=None, public=True
    )
    validate_schema(schema)
    components = schema["components"]["schemas"]
    assert "harness_overrides" in components["TriggerRequest"]["properties"]
    assert "harness_notices" in components["TriggeredRun"]["properties"]
    assert "harness_notices" in components["RunDetail"]["properties"]
    assert set(components["HarnessNotice"]["properties"]) == {
        "role", "employee", "field", "asked", "got", "decidedBy"
    }  # fmt: skip
    preview = schema["paths"]["/api/v1/patterns/{key}/harness-preview"]["post"]
    assert preview["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "HarnessPreviewRequest"
    )

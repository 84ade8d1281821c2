"""An AI employee's own harness layers: a profile tag and inline settings, over the API, the
services and the admin, with problem+json pointers into the settings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import include, path
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

from harness.services import profile_create
from orchestrator.agents.models import Employee
from orchestrator.agents.services import employee_create, model_endpoint_create
from orchestrator.errors import InvalidInput

pytestmark = pytest.mark.django_db
PROBLEM = "application/problem+json"
EMPLOYEES = "/api/v1/employees"
TIGHT = {"limits": {"maxInvocations": 2, "recursionLimit": 4}}


@pytest.fixture
def operator(api_client_for: Callable[[str], APIClient]) -> APIClient:
    model_endpoint_create(name="offline", provider="scripted", script="demo")
    profile_create(tag="tight", settings=TIGHT)
    return api_client_for("operator")


def problems(response: Any) -> dict[str, str]:
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == PROBLEM
    return {error["pointer"]: error["detail"] for error in response.json()["errors"]}


def test_an_employee_is_created_with_a_profile_tag_and_inline_settings(operator: APIClient):
    body = {
        "username": "ada",
        "endpoint": "offline",
        "harness_tag": "tight@1",
        "harness": {"tools": {"deny": ["write"]}, "limits": {"maxTokens": 5000}},
    }
    response = operator.post(EMPLOYEES, body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["harness_tag"] == "tight@1"
    assert response.json()["harness"] == body["harness"]
    stored = Employee.objects.get(username="ada")
    assert (stored.harness_tag, stored.harness) == ("tight@1", body["harness"])


def test_blank_tag_and_empty_settings_are_the_defaults(operator: APIClient):
    response = operator.post(EMPLOYEES, {"username": "bo", "endpoint": "offline"}, format="json")
    assert response.status_code == 201, response.content
    assert (response.json()["harness_tag"], response.json()["harness"]) == ("", {})


def test_invalid_inline_settings_are_refused_with_pointers_into_them(operator: APIClient):
    body = {
        "username": "cy",
        "endpoint": "offline",
        "harness": {"limits": {"maxTokens": "many", "bogus": 1}, "tools": {"deny": "write"}},
    }
    found = problems(operator.post(EMPLOYEES, body, format="json"))
    assert {"/harness/limits/maxTokens", "/harness/limits/bogus", "/harness/tools/deny"} <= set(
        found
    )
    assert not Employee.objects.filter(username="cy").exists()


@pytest.mark.parametrize("tag", ["ghost", "tight@9", "not a tag"])
def test_a_tag_that_names_no_published_profile_is_refused(operator: APIClient, tag: str):
    body = {"username": "dee", "endpoint": "offline", "harness_tag": tag}
    found = problems(operator.post(EMPLOYEES, body, format="json"))
    assert list(found) == ["/harness_tag"]
    assert "names no published harness profile" in found["/harness_tag"]


def test_null_settings_are_refused(operator: APIClient):
    body = {"username": "eve", "endpoint": "offline", "harness": None}
    assert "/harness" in problems(operator.post(EMPLOYEES, body, format="json"))


def test_a_patch_changes_the_layers_and_is_validated_the_same_way(operator: APIClient):
    operator.post(EMPLOYEES, {"username": "fay", "endpoint": "offline"}, format="json")
    url = f"{EMPLOYEES}/fay"
    bad = operator.patch(url, {"harness": {"isolation": {"networkAccess": "open"}}}, format="json")
    assert "/harness/isolation/networkAccess" in problems(bad)
    good = operator.patch(url, {"harness_tag": "tight", "harness": TIGHT}, format="json")
    assert good.status_code == 200, good.content
    assert (good.json()["harness_tag"], good.json()["harness"]) == ("tight", TIGHT)
    cleared = operator.patch(url, {"harness_tag": "", "harness": {}}, format="json")
    assert (cleared.json()["harness_tag"], cleared.json()["harness"]) == ("", {})


def test_the_service_refuses_with_the_same_pointers(operator: APIClient):
    endpoint = Employee._meta.get_field("endpoint").related_model.objects.get(name="offline")
    with pytest.raises(InvalidInput) as caught:
        employee_create(
            username="gus", endpoint=endpoint, harness_tag="ghost", harness={"limits": []}
        )
    assert {e["pointer"] for e in caught.value.extra["errors"]} == {
        "/harness_tag",
        "/harness/limits",
    }


def test_the_admin_shows_each_problem_at_its_field(operator: APIClient):
    admin = get_user_model().objects.create_superuser("root", "root@example.test", "pw")
    client = Client()
    client.force_login(admin)
    endpoint = Employee._meta.get_field("endpoint").related_model.objects.get(name="offline")
    form = {
        "username": "hal", "display_name": "", "endpoint": endpoint.pk, "system_prompt": "",
        "params": "{}", "max_steps": 12, "tools": "[]", "tool_concurrency": 4,
        "tool_timeout_seconds": 60, "max_tool_output_length": 50000,
        "stream_tool_call_check": "auto", "stream_retry_mode": "off", "harness_tag": "ghost",
        "harness": '{"limits": {"maxTokens": -1}}',
    }  # fmt: skip
    response = client.post("/admin/agents/employee/add/", form)
    assert response.status_code == 200  # the form again, with errors
    errors = response.context["adminform"].form.errors
    assert "names no published harness profile" in errors["harness_tag"][0]
    assert errors["harness"][0].startswith("limits.maxTokens: ")
    form.update(harness_tag="tight", harness='{"limits": {"maxTokens": 10}}')
    assert client.post("/admin/agents/employee/add/", form).status_code == 302
    assert Employee.objects.get(username="hal").harness == {"limits": {"maxTokens": 10}}


def test_the_openapi_schema_documents_the_harness_fields():
    GENERATOR_STATS.reset()
    patterns = [path("api/v1/", include("orchestrator.agents.urls"))]
    schema = SchemaGenerator(patterns=patterns).get_schema(request=None, public=True)
    validate_schema(schema)
    assert not GENERATOR_STATS, "drf-spectacular warned about the agents API"
    employee = schema["components"]["schemas"]["Employee"]["properties"]
    assert "published harness profile" in employee["harness_tag"]["description"]
    assert employee["harness"]["allOf"] == [{"$ref": "#/components/schemas/HarnessLayer"}]


def test_an_employee_row_without_services_still_defaults_to_no_layers():
    endpoint = model_endpoint_create(name="plain", provider="scripted", script="demo")
    employee = employee_create(username="ivy", endpoint=endpoint)
    assert (employee.harness_tag, employee.harness) == ("", {})

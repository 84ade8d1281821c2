"""The REST API for model endpoints and AI employees."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.urls import include, path
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db
PROBLEM = "application/problem+json"
ENDPOINTS = "/api/v1/model-endpoints"
EMPLOYEES = "/api/v1/employees"

PRIMARY = {
    "name": "primary",
    "base_url": "https://models.example.test/v1",
    "model": "glm-5",
    "api_key_env": "LOOPWRIGHT_SECRET_TEST_PRIMARY_KEY",
    "params": {"temperature": 0.7, "topP": 0.9, "maxTokens": 4096},
    "input_price_per_token": "0.000002",
    "output_price_per_token": "0.000008",
}


@pytest.fixture
def operator(api_client_for: Callable[[str], APIClient]) -> APIClient:
    return api_client_for("operator")


def create(client: APIClient, url: str, data: dict[str, Any]) -> dict[str, Any]:
    response = client.post(url, data, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def pointers(response: Any) -> set[str]:
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == PROBLEM
    return {error["pointer"] for error in response.json()["errors"]}


# --- model endpoints -----------------------------------------------------------------------------


def test_an_operator_creates_an_endpoint_with_defaults(operator: APIClient):
    endpoint = create(operator, ENDPOINTS, PRIMARY)

    assert endpoint["name"] == "primary"
    assert endpoint["provider"] == "openai"
    assert endpoint["params"] == {"temperature": 0.7, "topP": 0.9, "maxTokens": 4096}
    assert (endpoint["max_retries"], endpoint["circuit_cooldown_seconds"]) == (3, 60)
    assert endpoint["timeout_seconds"] == 60
    assert endpoint["failover"] == []
    assert endpoint["input_price_per_token"] == "0.000002000000"
    assert operator.get(f"{ENDPOINTS}/primary").json() == endpoint


def test_the_api_key_is_never_returned_only_whether_it_is_set(
    operator: APIClient, monkeypatch: pytest.MonkeyPatch
):
    create(operator, ENDPOINTS, PRIMARY)
    assert operator.get(f"{ENDPOINTS}/primary").json()["api_key_configured"] is False

    monkeypatch.setenv("LOOPWRIGHT_SECRET_TEST_PRIMARY_KEY", "sk-never-shown-123456")
    detail = operator.get(f"{ENDPOINTS}/primary")
    listing = operator.get(ENDPOINTS)

    assert detail.json()["api_key_configured"] is True
    assert detail.json()["api_key_env"] == "LOOPWRIGHT_SECRET_TEST_PRIMARY_KEY"
    for response in (detail, listing):
        assert b"sk-never-shown-123456" not in response.content


def test_sending_a_key_is_refused_without_echoing_it(operator: APIClient):
    response = operator.post(ENDPOINTS, {**PRIMARY, "api_key": "sk-plain-text-key"}, format="json")

    assert pointers(response) == {"/api_key"}
    assert b"sk-plain-text-key" not in response.content


@pytest.mark.parametrize(
    ("params", "pointer", "field"),
    [
        ({"temperature": 2.5}, "/params/temperature", "temperature"),
        ({"topP": -0.1}, "/params/topP", "topP"),
        ({"frequencyPenalty": 1.5}, "/params/frequencyPenalty", "frequencyPenalty"),
        ({"presencePenalty": 2}, "/params/presencePenalty", "presencePenalty"),
        ({"maxTokens": -1}, "/params/maxTokens", "maxTokens"),
        ({"responseFormat": "yaml"}, "/params/responseFormat", "responseFormat"),
        ({"temprature": 0.5}, "/params/temprature", "temprature"),
        ({"extraFields": {"model": "x"}}, "/params/extraFields", "extraFields"),
    ],
)
def test_bad_parameters_are_400_naming_the_field(
    operator: APIClient, params: dict[str, Any], pointer: str, field: str
):
    response = operator.post(ENDPOINTS, {**PRIMARY, "params": params}, format="json")

    assert pointers(response) == {pointer}
    assert field in response.json()["detail"]


def test_a_json_schema_format_needs_a_schema(operator: APIClient):
    response = operator.post(
        ENDPOINTS, {**PRIMARY, "params": {"responseFormat": "json_schema"}}, format="json"
    )

    assert pointers(response) == {"/params"}
    assert "jsonSchema" in response.json()["detail"]


@pytest.mark.parametrize(
    ("change", "pointer"),
    [
        ({"max_retries": 11}, "/max_retries"),
        ({"timeout_seconds": 0}, "/timeout_seconds"),
        ({"circuit_cooldown_seconds": 0}, "/circuit_cooldown_seconds"),
        ({"api_key_env": "not a name"}, "/api_key_env"),
        ({"provider": "anthropic"}, "/provider"),
        ({"name": "Not A Slug"}, "/name"),
        ({"input_price_per_token": "-1"}, "/input_price_per_token"),
    ],
)
def test_bad_endpoint_fields_are_400(operator: APIClient, change: dict[str, Any], pointer: str):
    assert pointers(operator.post(ENDPOINTS, {**PRIMARY, **change}, format="json")) == {pointer}


def test_an_http_endpoint_needs_a_url_and_a_model(operator: APIClient):
    response = operator.post(ENDPOINTS, {"name": "bare"}, format="json")

    assert response.status_code == 400
    assert "base URL and a model" in response.json()["detail"]


def test_a_scripted_endpoint_needs_no_url_but_a_known_script(operator: APIClient):
    endpoint = create(operator, ENDPOINTS, {"name": "offline", "provider": "scripted"})
    assert endpoint["script"] == ""

    response = operator.post(
        ENDPOINTS, {"name": "bad", "provider": "scripted", "script": "nope"}, format="json"
    )
    assert pointers(response) == {"/script"}


def test_failover_endpoints_are_kept_in_priority_order(operator: APIClient):
    for name in ("backup-1", "backup-2"):
        create(operator, ENDPOINTS, {**PRIMARY, "name": name})
    failover = [
        {"endpoint": "backup-2", "model": "glm-5-air", "params": {"temperature": 0.2}},
        {"endpoint": "backup-1"},
    ]

    endpoint = create(operator, ENDPOINTS, {**PRIMARY, "failover": failover})

    assert endpoint["failover"] == [
        {"endpoint": "backup-2", "model": "glm-5-air", "params": {"temperature": 0.2}},
        {"endpoint": "backup-1", "model": "", "params": {}},
    ]


def test_failover_references_are_checked(operator: APIClient):
    create(operator, ENDPOINTS, PRIMARY)
    create(operator, ENDPOINTS, {"name": "offline", "provider": "scripted"})

    unknown = operator.patch(
        f"{ENDPOINTS}/primary", {"failover": [{"endpoint": "ghost"}]}, format="json"
    )
    itself = operator.patch(
        f"{ENDPOINTS}/primary", {"failover": [{"endpoint": "primary"}]}, format="json"
    )
    scripted = operator.patch(
        f"{ENDPOINTS}/primary", {"failover": [{"endpoint": "offline"}]}, format="json"
    )
    bad_params = operator.patch(
        f"{ENDPOINTS}/primary",
        {"failover": [{"endpoint": "offline", "params": {"topP": 3}}]},
        format="json",
    )

    assert pointers(unknown) == {"/failover/0/endpoint"}
    assert pointers(itself) == {"/failover/0/endpoint"}
    assert pointers(scripted) == {"/failover/0/endpoint"}
    assert pointers(bad_params) == {"/failover/0/params/topP"}


def test_a_patch_changes_only_what_it_names(operator: APIClient):
    create(operator, ENDPOINTS, {**PRIMARY, "name": "backup"})
    create(operator, ENDPOINTS, {**PRIMARY, "failover": [{"endpoint": "backup"}]})

    response = operator.patch(
        f"{ENDPOINTS}/primary", {"params": {"temperature": 0.1}, "max_retries": 5}, format="json"
    )

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["params"] == {"temperature": 0.1}
    assert body["max_retries"] == 5
    assert body["model"] == "glm-5"
    assert [hop["endpoint"] for hop in body["failover"]] == ["backup"]


def test_the_name_cannot_change(operator: APIClient):
    create(operator, ENDPOINTS, PRIMARY)

    response = operator.patch(f"{ENDPOINTS}/primary", {"name": "renamed"}, format="json")

    assert pointers(response) == {"/name"}


def test_an_endpoint_in_use_cannot_be_deleted(operator: APIClient):
    create(operator, ENDPOINTS, PRIMARY)
    create(operator, EMPLOYEES, {"username": "maker-a", "endpoint": "primary"})

    response = operator.delete(f"{ENDPOINTS}/primary")

    assert response.status_code == 409
    assert response["Content-Type"] == PROBLEM
    assert "maker-a" in response.json()["detail"]


def test_an_unused_endpoint_is_deleted(operator: APIClient):
    create(operator, ENDPOINTS, PRIMARY)

    assert operator.delete(f"{ENDPOINTS}/primary").status_code == 204
    assert operator.get(f"{ENDPOINTS}/primary").status_code == 404


# --- employees -----------------------------------------------------------------------------------


def test_an_operator_creates_an_employee_with_the_documented_defaults(operator: APIClient):
    create(operator, ENDPOINTS, PRIMARY)

    employee = create(
        operator,
        EMPLOYEES,
        {
            "username": "maker-a",
            "display_name": "Maker A",
            "endpoint": "primary",
            "system_prompt": "You change files. role:maker",
            "tools": ["read", "write"],
        },
    )

    assert employee["endpoint"] == "primary"
    assert employee["max_steps"] == 12
    assert employee["tool_concurrency"] == 4
    assert employee["tool_timeout_seconds"] == 60
    assert employee["max_tool_output_length"] == 50_000
    assert employee["streaming"] is False
    assert employee["stream_tool_call_check"] == "auto"
    assert employee["tools"] == ["read", "write"]
    assert operator.get(f"{EMPLOYEES}/maker-a").json() == employee
    assert operator.get(EMPLOYEES).json()["results"] == [employee]


def test_an_employee_is_changed_and_deleted(operator: APIClient):
    create(operator, ENDPOINTS, PRIMARY)
    create(operator, ENDPOINTS, {**PRIMARY, "name": "other"})
    create(operator, EMPLOYEES, {"username": "maker-a", "endpoint": "primary"})

    response = operator.patch(
        f"{EMPLOYEES}/maker-a",
        {
            "endpoint": "other",
            "streaming": True,
            "stream_tool_call_check": "drain",
            "params": {"temperature": 0},
        },
        format="json",
    )

    assert response.status_code == 200, response.content
    assert response.json()["endpoint"] == "other"
    assert response.json()["stream_tool_call_check"] == "drain"
    assert response.json()["params"] == {"temperature": 0}
    assert operator.delete(f"{EMPLOYEES}/maker-a").status_code == 204
    assert operator.get(f"{EMPLOYEES}/maker-a").status_code == 404


@pytest.mark.parametrize(
    ("change", "pointer"),
    [
        ({"endpoint": "ghost"}, "/endpoint"),
        ({"max_steps": 0}, "/max_steps"),
        ({"tool_concurrency": 65}, "/tool_concurrency"),
        ({"tool_timeout_seconds": 0}, "/tool_timeout_seconds"),
        ({"max_tool_output_length": 0}, "/max_tool_output_length"),
        ({"stream_tool_call_check": "sometimes"}, "/stream_tool_call_check"),
        ({"tools": ["read", "read"]}, "/tools"),
        ({"tools": ["bad name"]}, "/tools/0"),
        ({"params": {"temperature": 3}}, "/params/temperature"),
        ({"username": "has space"}, "/username"),
        ({"system_prompt": "Ticket ${inputs.id"}, "/system_prompt"),
    ],
)
def test_bad_employee_fields_are_400(operator: APIClient, change: dict[str, Any], pointer: str):
    create(operator, ENDPOINTS, PRIMARY)
    data = {"username": "maker-a", "endpoint": "primary", **change}

    assert pointers(operator.post(EMPLOYEES, data, format="json")) == {pointer}


def test_usernames_are_unique(operator: APIClient):
    create(operator, ENDPOINTS, PRIMARY)
    create(operator, EMPLOYEES, {"username": "maker-a", "endpoint": "primary"})

    response = operator.post(
        EMPLOYEES, {"username": "maker-a", "endpoint": "primary"}, format="json"
    )

    assert pointers(response) == {"/username"}


# --- who may do what -----------------------------------------------------------------------------


def test_a_viewer_reads_but_cannot_write(
    operator: APIClient, api_client_for: Callable[[str], APIClient]
):
    create(operator, ENDPOINTS, PRIMARY)
    create(operator, EMPLOYEES, {"username": "maker-a", "endpoint": "primary"})
    viewer = api_client_for("viewer")

    assert viewer.get(f"{ENDPOINTS}/primary").status_code == 200
    assert viewer.get(f"{EMPLOYEES}/maker-a").status_code == 200
    writes = [
        viewer.post(ENDPOINTS, {**PRIMARY, "name": "mine"}, format="json"),
        viewer.patch(f"{ENDPOINTS}/primary", {"max_retries": 1}, format="json"),
        viewer.delete(f"{ENDPOINTS}/primary"),
        viewer.post(EMPLOYEES, {"username": "x", "endpoint": "primary"}, format="json"),
        viewer.patch(f"{EMPLOYEES}/maker-a", {"max_steps": 2}, format="json"),
        viewer.delete(f"{EMPLOYEES}/maker-a"),
    ]
    for response in writes:
        assert response.status_code == 403
        assert response["Content-Type"] == PROBLEM


def test_anonymous_calls_get_401_and_users_without_a_role_403(
    api_client_for: Callable[[str], APIClient],
):
    anonymous = api_client_for("anonymous")
    for url in (ENDPOINTS, EMPLOYEES):
        response = anonymous.get(url)
        assert response.status_code == 401
        assert response["Content-Type"] == PROBLEM
        assert anonymous.post(url, {}, format="json").status_code == 401
        assert api_client_for("outsider").get(url).status_code == 403


def test_an_admin_may_write_too(api_client_for: Callable[[str], APIClient]):
    create(api_client_for("admin"), ENDPOINTS, PRIMARY)


def test_the_openapi_schema_documents_both_resources_validly_and_without_warnings():
    GENERATOR_STATS.reset()
    patterns = [path("api/v1/", include("orchestrator.agents.urls"))]

    schema = SchemaGenerator(patterns=patterns).get_schema(request=None, public=True)

    validate_schema(schema)  # OpenAPI 3.0: the params schema from pydantic was converted
    assert not GENERATOR_STATS, "drf-spectacular warned about the agents API"
    assert {"/api/v1/model-endpoints/{name}", "/api/v1/employees/{username}"} <= set(
        schema["paths"]
    )
    endpoint = schema["components"]["schemas"]["ModelEndpoint"]["properties"]
    assert endpoint["api_key_configured"]["readOnly"] is True
    assert "api_key" not in endpoint
    assert endpoint["params"]["properties"]["topP"]["maximum"] == 1

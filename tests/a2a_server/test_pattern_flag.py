"""``a2a_enabled`` through the pattern API: off by default, set on create and update (a version
bump like any change), returned, described in the OpenAPI schema; a non-boolean is a 400."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db
PATTERN = {
    "key": "flagged",
    "goal_template": "Do {{ inputs.what }}",
    "leader_username": "lead",
    "maker_usernames": ["maker"],
    "verifier_username": "check",
}


def test_the_flag_is_off_by_default_and_set_through_the_api(operator_client: APIClient) -> None:
    created = operator_client.post("/api/v1/patterns", PATTERN, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["a2a_enabled"] is False
    on = operator_client.patch("/api/v1/patterns/flagged", {"a2a_enabled": True}, format="json")
    assert on.status_code == 200, on.json()
    assert (on.json()["a2a_enabled"], on.json()["version"]) == (True, 2)
    assert operator_client.get("/api/v1/patterns/flagged").json()["a2a_enabled"] is True
    second = operator_client.post(
        "/api/v1/patterns", {**PATTERN, "key": "born-on", "a2a_enabled": True}, format="json"
    )
    assert second.json()["a2a_enabled"] is True
    bad = operator_client.patch("/api/v1/patterns/flagged", {"a2a_enabled": "x"}, format="json")
    assert bad.status_code == 400
    assert bad.json()["errors"][0]["pointer"] == "/a2a_enabled"
    unknown = operator_client.patch("/api/v1/patterns/flagged", {"a2a": True}, format="json")
    assert unknown.status_code == 400


def test_the_openapi_schema_describes_the_flag(viewer_client: APIClient) -> None:
    schema = viewer_client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    field = schema["components"]["schemas"]["Pattern"]["properties"]["a2a_enabled"]
    assert field["type"] == "boolean"
    assert "/a2a/<key>" in field["description"]

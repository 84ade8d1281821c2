"""The harness profile API over HTTP: roles, shapes, problem+json errors and OpenAPI."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

from harness.models import HarnessProfile

pytestmark = pytest.mark.django_db

BASE = "/api/v1/harness-profiles"
Clients = Callable[[str], APIClient]


@pytest.fixture
def admin(api_client_for: Clients) -> APIClient:
    return api_client_for("admin")


def problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    return dict(response.json())


# --- Reading ------------------------------------------------------------------------------------


@pytest.mark.parametrize("persona", ["viewer", "operator", "approver", "admin"])
def test_every_role_lists_the_profiles(api_client_for: Clients, persona: str) -> None:
    response = api_client_for(persona).get(BASE)
    assert response.status_code == 200
    tags = [p["tag"] for p in response.json()["results"]]
    assert tags == ["default", "file-heavy", "safe"]


@pytest.mark.parametrize(("persona", "status"), [("outsider", 403), ("anonymous", 401)])
def test_people_without_a_role_read_nothing(
    api_client_for: Clients, persona: str, status: int
) -> None:
    problem(api_client_for(persona).get(BASE), status)


def test_a_profile_is_retrieved_by_tag_with_its_current_version(api_client_for: Clients) -> None:
    body = api_client_for("viewer").get(f"{BASE}/safe").json()
    assert body["tag"] == "safe"
    assert body["draft_version"] is None
    assert body["current_version"]["version"] == 1
    assert body["current_version"]["status"] == "published"
    assert body["current_version"]["settings"]["isolation"]["networkAccess"] == "deny"


def test_an_unknown_tag_is_a_404_problem(api_client_for: Clients) -> None:
    problem(api_client_for("viewer").get(f"{BASE}/ghost"), 404)


# --- Lifecycle ----------------------------------------------------------------------------------


def test_an_admin_creates_a_profile_with_version_one_published(admin: APIClient) -> None:
    response = admin.post(
        f"{BASE}/create-profile",
        {"tag": "team", "description": "ours", "settings": {"limits": {"maxTokens": 9}}},
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["tag"] == "team"
    assert body["current_version"]["version"] == 1
    assert body["current_version"]["status"] == "published"
    assert body["current_version"]["created_by"] == "admin"
    assert body["current_version"]["settings"] == {"limits": {"maxTokens": 9}}


def test_posting_to_the_collection_creates_too(admin: APIClient) -> None:
    response = admin.post(BASE, {"tag": "team", "settings": {}}, format="json")
    assert response.status_code == 201


@pytest.mark.parametrize("persona", ["viewer", "operator", "approver"])
def test_only_admins_write(api_client_for: Clients, persona: str) -> None:
    client = api_client_for(persona)
    problem(client.post(f"{BASE}/create-profile", {"tag": "x", "settings": {}}, format="json"), 403)
    problem(client.post(f"{BASE}/default/save-draft", {"settings": {}}, format="json"), 403)
    problem(client.post(f"{BASE}/default/publish", {}, format="json"), 403)
    problem(client.patch(f"{BASE}/default", {"description": "x"}, format="json"), 403)
    problem(client.delete(f"{BASE}/default"), 403)


@pytest.mark.parametrize("tag", ["compile", "validate", "create-profile"])
def test_a_tag_that_names_a_collection_action_is_refused(admin: APIClient, tag: str) -> None:
    body = problem(
        admin.post(f"{BASE}/create-profile", {"tag": tag, "settings": {}}, format="json"), 400
    )
    assert "reserved" in body["detail"]


def test_a_duplicate_tag_is_a_409(admin: APIClient) -> None:
    body = problem(
        admin.post(f"{BASE}/create-profile", {"tag": "safe", "settings": {}}, format="json"), 409
    )
    assert "already exists" in body["detail"]


def test_invalid_settings_are_a_400_listing_every_problem(admin: APIClient) -> None:
    response = admin.post(
        f"{BASE}/create-profile",
        {"tag": "team", "settings": {"tools": {"allow": [1]}, "limits": {"maxCost": -1}, "x": 1}},
        format="json",
    )
    body = problem(response, 400)
    assert sorted(e["pointer"] for e in body["errors"]) == [
        "/settings/limits/maxCost",
        "/settings/tools/allow/0",
        "/settings/x",
    ]
    assert not HarnessProfile.objects.filter(tag="team").exists()


def test_unknown_body_fields_and_malformed_json_are_400(admin: APIClient) -> None:
    body = problem(
        admin.post(
            f"{BASE}/create-profile", {"tag": "t", "settings": {}, "sttings": {}}, format="json"
        ),
        400,
    )
    assert [e["pointer"] for e in body["errors"]] == ["/sttings"]
    problem(admin.post(f"{BASE}/create-profile", "{not json", content_type="application/json"), 400)
    problem(admin.post(f"{BASE}/create-profile", [], format="json"), 400)


def test_save_draft_then_publish_and_the_conflicts_around_them(admin: APIClient) -> None:
    first = admin.post(f"{BASE}/default/save-draft", {"settings": {}, "note": "try"}, format="json")
    assert first.status_code == 200, first.content
    assert (first.json()["version"], first.json()["status"]) == (2, "draft")
    again = admin.post(
        f"{BASE}/default/save-draft", {"settings": {"memory": {"enabled": False}}}, format="json"
    )
    assert again.json()["version"] == 2
    assert again.json()["note"] == "try"
    assert admin.get(f"{BASE}/default").json()["draft_version"] == 2

    body = problem(admin.post(f"{BASE}/default/publish", {"version": 1}, format="json"), 409)
    assert "already published" in body["detail"]
    published = admin.post(f"{BASE}/default/publish", {"version": 2}, format="json")
    assert published.status_code == 200
    assert published.json()["status"] == "published"
    assert published.json()["published_by"] == "admin"
    body = problem(admin.post(f"{BASE}/default/publish", {}, format="json"), 409)
    assert "no open draft" in body["detail"]

    profile = admin.get(f"{BASE}/default").json()
    assert profile["current_version"]["version"] == 2
    assert profile["draft_version"] is None


def test_versions_are_listed_newest_first(admin: APIClient) -> None:
    admin.post(f"{BASE}/safe/save-draft", {"settings": {}}, format="json")
    body = admin.get(f"{BASE}/safe/versions").json()
    assert [(v["version"], v["status"]) for v in body["results"]] == [
        (2, "draft"),
        (1, "published"),
    ]
    problem(admin.get(f"{BASE}/ghost/versions"), 404)


def test_writes_to_an_unknown_profile_are_404(admin: APIClient) -> None:
    problem(admin.post(f"{BASE}/ghost/save-draft", {"settings": {}}, format="json"), 404)
    problem(admin.post(f"{BASE}/ghost/publish", {}, format="json"), 404)
    problem(admin.post(f"{BASE}/default/publish", {"version": 9}, format="json"), 404)


def test_patch_and_put_change_only_the_description(admin: APIClient) -> None:
    assert (
        admin.patch(f"{BASE}/safe", {"description": "d1"}, format="json").json()["description"]
        == "d1"
    )
    assert (
        admin.put(f"{BASE}/safe", {"description": "d2"}, format="json").json()["description"]
        == "d2"
    )
    body = problem(admin.patch(f"{BASE}/safe", {"settings": {}}, format="json"), 400)
    assert "/settings" in [e["pointer"] for e in body["errors"]]


def test_seeded_profiles_cannot_be_deleted_but_others_can(admin: APIClient) -> None:
    problem(admin.delete(f"{BASE}/safe"), 409)
    admin.post(f"{BASE}/create-profile", {"tag": "team", "settings": {}}, format="json")
    assert admin.delete(f"{BASE}/team").status_code == 204
    problem(admin.get(f"{BASE}/team"), 404)


# --- Validate and compile -----------------------------------------------------------------------


def test_validate_reports_every_problem_for_any_role(api_client_for: Clients) -> None:
    client = api_client_for("viewer")
    bad = {"tools": {"deny": "x"}, "limits": {"maxTokens": -5}, "memory": {"scopes": ["team"]}}
    body = client.post(f"{BASE}/validate", {"settings": bad}, format="json").json()
    assert body["valid"] is False
    assert sorted(e["pointer"] for e in body["errors"]) == [
        "/settings/limits/maxTokens",
        "/settings/memory/scopes/0",
        "/settings/tools/deny",
    ]
    ok = client.post(f"{BASE}/validate", {"settings": {"tools": {"allow": ["*"]}}}, format="json")
    assert ok.json() == {"valid": True, "errors": []}
    problem(client.post(f"{BASE}/validate", {}, format="json"), 400)


def test_compile_previews_settings_provenance_layers_and_the_tool_plan(
    api_client_for: Clients,
) -> None:
    response = api_client_for("operator").post(
        f"{BASE}/compile",
        {
            "tag": "file-heavy",
            "pattern": {"limits": {"maxTokens": 1234}},
            "employee": {"username": "alice", "harness": {"tools": {"deny": ["edit"]}}},
            "overrides": {"isolation": {"networkAccess": "deny"}},
            "tools": [
                {"name": "read", "effect": "read"},
                {"name": "write", "effect": "write"},
                {"name": "edit", "effect": "write"},
                {"name": "deploy", "effect": "external"},
                {"name": "web_search", "effect": "read", "enforceable": False},
            ],
        },
        format="json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["profile"] == {"tag": "file-heavy", "version": 1}
    assert body["layers"] == [
        "platform",
        "profile:file-heavy@1",
        "pattern",
        "employee:alice",
        "run",
    ]
    assert body["settings"]["limits"]["maxTokens"] == 1234
    assert body["provenance"]["tools.deny"] == "employee:alice"
    assert body["provenance"]["isolation.networkAccess"] == "run"
    plan = {t["name"]: (t["decision"], t["tier"]) for t in body["toolPlan"]}
    assert plan == {
        "read": ("allow", "read"),
        "write": ("allow", "write"),
        "edit": ("deny", "write"),
        "deploy": ("ask", "high-risk"),
        "web_search": ("deny", "read"),
    }
    assert all(t["reason"] for t in body["toolPlan"])


def test_compile_of_a_pinned_version_without_tools_gives_an_empty_plan(
    api_client_for: Clients,
) -> None:
    body = api_client_for("viewer").post(f"{BASE}/compile", {"tag": "safe@1"}, format="json").json()
    assert body["layers"] == ["platform", "profile:safe@1"]
    assert body["toolPlan"] == []


@pytest.mark.parametrize(
    ("payload", "pointers"),
    [
        (
            {"tag": "default", "pattern": {"limits": {"maxTokens": "x"}}},
            ["/pattern/limits/maxTokens"],
        ),
        ({"tag": "default", "employee": {"harness": {"nope": 1}}}, ["/employee/harness/nope"]),
        ({"tag": "default", "overrides": []}, ["/overrides"]),
        ({"tag": "default", "tools": [{"name": "a", "effect": "delete"}]}, ["/tools/0/effect"]),
        ({"tag": "default", "employee": {"name": "bob"}}, ["/employee/name"]),
        (
            {
                "tag": "default",
                "tools": [{"name": "a", "effect": "read"}, {"name": "a", "effect": "read"}],
            },
            ["/tools"],
        ),
    ],
)
def test_compile_refuses_bad_input_with_pointers(
    api_client_for: Clients, payload: dict[str, Any], pointers: list[str]
) -> None:
    body = problem(api_client_for("viewer").post(f"{BASE}/compile", payload, format="json"), 400)
    assert [e["pointer"] for e in body["errors"]] == pointers


def test_compile_of_an_unknown_tag_is_a_400_naming_it(api_client_for: Clients) -> None:
    body = problem(
        api_client_for("viewer").post(f"{BASE}/compile", {"tag": "ghost"}, format="json"), 400
    )
    assert body["type"].endswith("/unknown-harness-profile")
    assert "'ghost'" in body["detail"]


# --- OpenAPI ------------------------------------------------------------------------------------


def test_openapi_documents_the_endpoints_and_the_settings_schema(api_client_for: Clients) -> None:
    response = api_client_for("viewer").get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    schema = response.json()
    paths = schema["paths"]
    for path in (
        "/api/v1/harness-profiles",
        "/api/v1/harness-profiles/{tag}",
        "/api/v1/harness-profiles/{tag}/versions",
        "/api/v1/harness-profiles/{tag}/save-draft",
        "/api/v1/harness-profiles/{tag}/publish",
        "/api/v1/harness-profiles/create-profile",
        "/api/v1/harness-profiles/validate",
        "/api/v1/harness-profiles/compile",
    ):
        assert path in paths, path
    components = schema["components"]["schemas"]
    layer = components["HarnessLayer"]
    assert layer["additionalProperties"] is False
    assert layer["properties"]["limits"]["properties"]["maxTokens"]["minimum"] == 0
    assert "toolPlan" in components["CompileResult"]["properties"]
    compile_request = paths["/api/v1/harness-profiles/compile"]["post"]["requestBody"]
    assert compile_request["content"]["application/json"]["schema"]["$ref"].endswith(
        "CompileRequest"
    )
    harness_only = {p: v for p, v in paths.items() if p.startswith("/api/v1/harness-profiles")}
    validate_schema({**schema, "paths": harness_only})


# --- Issue 18: features not built, paths and hosts ----------------------------------------------


def test_validate_and_create_take_the_memory_section_and_refuse_bad_values(
    admin: APIClient,
) -> None:
    bad = {"memory": {"enabled": "yes", "maxItems": 5000, "scopes": ["team"]}}
    body = admin.post(f"{BASE}/validate", {"settings": bad}, format="json").json()
    assert body["valid"] is False
    found = {e["pointer"] for e in body["errors"]}
    assert found == {
        "/settings/memory/enabled",
        "/settings/memory/maxItems",
        "/settings/memory/scopes/0",
    }
    created = problem(
        admin.post(f"{BASE}/create-profile", {"tag": "mem", "settings": bad}, format="json"), 400
    )
    assert {e["pointer"] for e in created["errors"]} == found
    assert not HarnessProfile.objects.filter(tag="mem").exists()
    good = {"memory": {"enabled": True, "write": False, "scopes": ["agent_user"], "maxChars": 900}}
    assert admin.post(f"{BASE}/validate", {"settings": good}, format="json").json()["valid"]


def test_compile_previews_denied_paths_file_limits_and_allowed_hosts(
    api_client_for: Clients,
) -> None:
    response = api_client_for("viewer").post(
        f"{BASE}/compile",
        {
            "tag": "default",
            "pattern": {
                "paths": {"deny": ["secrets/**"], "maxFiles": 7},
                "isolation": {"allowedHosts": ["pypi.org", "*.github.com"]},
            },
            "overrides": {
                "paths": {"deny": ["*.pem"], "maxFiles": 500},
                "isolation": {"allowedHosts": ["pypi.org"]},
            },
        },
        format="json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["settings"]["paths"] == {"deny": ["*.pem", "secrets/**"], "maxFiles": 7}
    assert body["provenance"]["paths.deny"] == "run"
    assert body["provenance"]["paths.maxFiles"] == "pattern"
    # the seeded default restricts the network to no host at all: nothing widens that
    assert body["settings"]["isolation"]["allowedHosts"] == []
    assert body["provenance"]["isolation.allowedHosts"] == "profile:default@1"
    assert body["settings"]["memory"]["maxChars"] == 4000  # the platform's, no layer tightened


def test_compile_refuses_a_bad_host_or_glob_with_pointers(api_client_for: Clients) -> None:
    payload = {
        "tag": "default",
        "pattern": {"paths": {"deny": [""]}},
        "overrides": {"isolation": {"allowedHosts": ["https://x.io"]}},
    }
    body = problem(api_client_for("viewer").post(f"{BASE}/compile", payload, format="json"), 400)
    assert [e["pointer"] for e in body["errors"]] == ["/pattern/paths/deny/0"]


def test_openapi_documents_paths_and_allowed_hosts(api_client_for: Clients) -> None:
    schema = api_client_for("viewer").get("/api/schema/", {"format": "json"}).json()
    layer = schema["components"]["schemas"]["HarnessLayer"]["properties"]
    assert layer["paths"]["properties"]["maxFiles"]["minimum"] == 0
    assert layer["paths"]["properties"]["deny"]["type"] == "array"
    assert "allowedHosts" in layer["isolation"]["properties"]
    assert "<agent_memory_context>" in layer["memory"]["properties"]["enabled"]["description"]

"""The instructions API over HTTP: lifecycle, immutability, diff, where-used, problems, roles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from instructions.models import Instruction
from loops.models import LoopPattern
from orchestrator.agents.services import employee_create, model_endpoint_create
from tests.instructions.conftest import TONE_V1
from tests.support.factories import make_pattern

pytestmark = pytest.mark.django_db

BASE = "/api/v1/instructions"
Clients = Callable[[str], APIClient]


@pytest.fixture
def admin(api_client_for: Clients) -> APIClient:
    return api_client_for("admin")


def problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    return dict(response.json())


def test_create_draft_publish_and_a_second_draft_beside_the_published_one(
    admin: APIClient,
) -> None:
    created = admin.post(
        BASE, {"name": "tone", "description": "how to sound", "text": "v1"}, format="json"
    )
    assert created.status_code == 201, created.content
    assert created.json()["current_version"] is None
    assert created.json()["draft_version"] == 1
    published = admin.post(f"{BASE}/tone/publish", {"version": 1}, format="json")
    assert published.status_code == 200, published.content
    assert published.json()["status"] == "published"
    assert published.json()["published_by"] == "admin"
    draft = admin.put(f"{BASE}/tone/draft", {"text": "v2", "note": "warmer"}, format="json")
    assert draft.status_code == 200, draft.content
    assert (draft.json()["version"], draft.json()["status"]) == (2, "draft")
    body = admin.get(f"{BASE}/tone").json()
    assert (body["current_version"]["version"], body["draft_version"]) == (1, 2)
    versions = admin.get(f"{BASE}/tone/versions").json()["results"]
    assert [(v["version"], v["status"]) for v in versions] == [(2, "draft"), (1, "published")]
    assert "text" not in versions[0]
    assert admin.get(f"{BASE}/tone/versions/1").json()["text"] == "v1"
    assert (
        admin.patch(f"{BASE}/tone", {"description": "new"}, format="json").json()["description"]
        == "new"
    )


def test_a_published_version_is_never_published_again_or_rewritten(
    admin: APIClient, tone: Instruction
) -> None:
    body = problem(admin.post(f"{BASE}/tone/publish", {"version": 1}, format="json"), 409)
    assert "already published" in body["detail"]
    problem(admin.post(f"{BASE}/tone/publish", {}, format="json"), 409)  # no open draft
    admin.put(f"{BASE}/tone/draft", {"text": "new"}, format="json")
    assert admin.get(f"{BASE}/tone/versions/1").json()["text"] == TONE_V1


def test_the_diff_of_two_versions(admin: APIClient, tone: Instruction) -> None:
    admin.put(f"{BASE}/tone/draft", {"text": "Be brief.\nBe warm.\n"}, format="json")
    body = admin.get(f"{BASE}/tone/diff?from=1&to=2").json()
    assert body["diff"].startswith("--- tone@1\n+++ tone@2\n")
    assert "+Be warm." in body["diff"]
    problem(admin.get(f"{BASE}/tone/diff?from=1"), 400)
    problem(admin.get(f"{BASE}/tone/diff?from=1&to=9"), 404)


def test_usage_names_employees_and_patterns_and_blocks_deletion(
    admin: APIClient, tone: Instruction
) -> None:
    endpoint = model_endpoint_create(name="offline", provider="scripted", script="demo")
    employee_create(
        username="ada", endpoint=endpoint, system_prompt="You are Ada. ${instructions.tone@1}"
    )
    employee_create(username="bob", endpoint=endpoint, system_prompt="instructions.tone, no ref")
    make_pattern(key="greet", goal_template="Greet. ${ instructions.tone }")
    usage = admin.get(f"{BASE}/tone/usage").json()
    assert usage == [
        {
            "kind": "employee",
            "label": "ada",
            "field": "system_prompt",
            "url": "/api/v1/employees/ada",
            "pinned_version": 1,
        },
        {
            "kind": "pattern",
            "label": "greet",
            "field": "goal_template",
            "url": "/api/v1/patterns/greet",
            "pinned_version": None,
        },
    ]
    body = problem(admin.delete(f"{BASE}/tone"), 409)
    assert "employee ada" in body["detail"] and "pattern greet" in body["detail"]
    LoopPattern.objects.filter(key="greet").delete()
    Instruction.objects.get(name="tone")  # still there
    admin.patch("/api/v1/employees/ada", {"system_prompt": "You are Ada."}, format="json")
    assert admin.delete(f"{BASE}/tone").status_code == 204
    problem(admin.get(f"{BASE}/tone"), 404)


def test_bad_input_and_missing_things_are_problems(admin: APIClient, tone: Instruction) -> None:
    body = problem(admin.post(BASE, {"name": "Bad Name"}, format="json"), 400)
    assert body["errors"][0]["pointer"] == "/name"
    problem(admin.post(BASE, {"name": "tone"}, format="json"), 409)
    body = problem(admin.put(f"{BASE}/tone/draft", {"text": "x" * 100_001}, format="json"), 400)
    assert body["errors"][0]["pointer"] == "/text"
    problem(admin.put(f"{BASE}/tone/draft", {"txt": "typo"}, format="json"), 400)
    problem(admin.get(f"{BASE}/ghost"), 404)
    problem(admin.get(f"{BASE}/tone/versions/7"), 404)
    problem(admin.post(f"{BASE}/tone/publish", {"version": 7}, format="json"), 404)


def test_every_role_reads_and_only_an_admin_writes(
    api_client_for: Clients, tone: Instruction
) -> None:
    viewer = api_client_for("viewer")
    assert viewer.get(BASE).json()["results"][0]["name"] == "tone"
    assert viewer.get(f"{BASE}/tone/usage").status_code == 200
    for persona in ("viewer", "operator"):
        client = api_client_for(persona)
        problem(client.post(BASE, {"name": "other"}, format="json"), 403)
        problem(client.put(f"{BASE}/tone/draft", {"text": "x"}, format="json"), 403)
        problem(client.post(f"{BASE}/tone/publish", {}, format="json"), 403)
        problem(client.patch(f"{BASE}/tone", {"description": "x"}, format="json"), 403)
        problem(client.delete(f"{BASE}/tone"), 403)
    problem(api_client_for("outsider").get(BASE), 403)
    problem(api_client_for("anonymous").get(BASE), 401)
    assert list(Instruction.objects.values_list("name", flat=True)) == ["tone"]

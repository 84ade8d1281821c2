"""``/api/v1/memories``: every role reads, operators write; bodies are strict (unknown fields
and wrong JSON types refused), refusals are problem+json naming the field; an item's uses say
which runs and chats were given it."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from rest_framework.test import APIClient

from memory.models import MemoryItem
from memory.services import UseOrigin, memory_uses_record
from tests.memory.conftest import item

pytestmark = pytest.mark.django_db
PROBLEM = "application/problem+json"
URL = "/api/v1/memories"


def problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == PROBLEM
    body: dict[str, Any] = response.json()
    return body


def pointers(body: dict[str, Any]) -> list[str]:
    return sorted(e["pointer"] for e in body.get("errors", []))


def test_an_operator_creates_reads_edits_and_deletes_an_item(
    operator_client: APIClient, viewer_client: APIClient
) -> None:
    created = operator_client.post(
        URL,
        {"scope": "agent_user", "username": "alice", "employee": "helper",
         "content": "Alice's repo is lw-core", "tags": ["repo"]},
        format="json",
    )  # fmt: skip
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["created_by"] == "operator" and body["source_run"] is None
    item_id = body["id"]

    got = viewer_client.get(f"{URL}/{item_id}")
    assert got.status_code == 200 and got.json()["content"] == "Alice's repo is lw-core"

    edited = operator_client.patch(
        f"{URL}/{item_id}", {"content": "Alice's repo is lw-main", "tags": []}, format="json"
    )
    assert edited.status_code == 200, edited.content
    assert (edited.json()["content"], edited.json()["tags"]) == ("Alice's repo is lw-main", [])
    assert edited.json()["scope"] == "agent_user"

    uses = viewer_client.get(f"{URL}/{item_id}/uses").json()["results"]
    assert [(u["kind"], u["actor"]) for u in uses] == [
        ("edited", "operator"),
        ("saved", "operator"),
    ]

    deleted = operator_client.delete(f"{URL}/{item_id}")
    assert deleted.status_code == 204
    problem(viewer_client.get(f"{URL}/{item_id}"), 404)
    assert not MemoryItem.objects.exists()


def test_the_list_filters_by_scope_person_employee_and_words(viewer_client: APIClient) -> None:
    item("public", "The office is closed on Fridays")
    item("user", "Alice prefers short answers", user="alice")
    item("agent_user", "Alice's repo is lw-core", user="alice", employee="helper")
    item("user", "Bob prefers long answers", user="bob", tags=["style"])

    def contents(query: str) -> list[str]:
        response = viewer_client.get(f"{URL}?{query}")
        assert response.status_code == 200, response.content
        return [i["content"] for i in response.json()["results"]]

    assert len(contents("")) == 4
    assert contents("scope=public") == ["The office is closed on Fridays"]
    assert sorted(contents("username=alice")) == [
        "Alice prefers short answers",
        "Alice's repo is lw-core",
    ]
    assert contents("employee=helper") == ["Alice's repo is lw-core"]
    assert contents("q=PREFERS+answers") == [
        "Bob prefers long answers",
        "Alice prefers short answers",
    ]
    assert contents("q=style") == ["Bob prefers long answers"]  # a tag
    assert contents("q=prefers+zebra") == []
    assert pointers(problem(viewer_client.get(f"{URL}?scope=team"), 400)) == ["/scope"]


def test_a_viewer_reads_but_cannot_write(viewer_client: APIClient) -> None:
    saved = item("public", "Fridays off")
    assert viewer_client.get(URL).status_code == 200
    problem(viewer_client.post(URL, {"scope": "public", "content": "x"}, format="json"), 403)
    problem(viewer_client.patch(f"{URL}/{saved.id}", {"content": "y"}, format="json"), 403)
    problem(viewer_client.delete(f"{URL}/{saved.id}"), 403)
    assert MemoryItem.objects.get().content == "Fridays off"


def test_anonymous_and_role_less_callers_are_refused(api_client_for: Any) -> None:
    problem(api_client_for("anonymous").get(URL), 401)
    problem(api_client_for("outsider").get(URL), 403)


def test_bodies_are_strict(operator_client: APIClient) -> None:
    unknown = problem(
        operator_client.post(URL, {"scope": "public", "content": "x", "contnet": "y"},
                             format="json"),
        400,
    )  # fmt: skip
    assert pointers(unknown) == ["/contnet"] and "content" in unknown["errors"][0]["detail"]
    mistyped = problem(operator_client.post(URL, {"scope": "public", "content": 5}, format="json"),
                       400)  # fmt: skip
    assert pointers(mistyped) == ["/content"]
    too_long = problem(
        operator_client.post(URL, {"scope": "public", "content": "x" * 4001}, format="json"), 400
    )
    assert pointers(too_long) == ["/content"]
    # The scope's keys, judged by the model's rules.
    keys = problem(operator_client.post(URL, {"scope": "user", "content": "x"}, format="json"), 400)
    assert pointers(keys) == ["/username"]
    assert not MemoryItem.objects.exists()


def test_an_edit_changes_only_content_and_tags(operator_client: APIClient) -> None:
    saved = item("user", "Alice prefers short answers", user="alice")
    moved = problem(
        operator_client.patch(f"{URL}/{saved.id}", {"scope": "public"}, format="json"), 400
    )
    assert pointers(moved) == ["/scope"]
    emptied = problem(
        operator_client.patch(f"{URL}/{saved.id}", {"content": "  "}, format="json"), 400
    )
    assert pointers(emptied) == ["/content"]
    replaced = operator_client.put(f"{URL}/{saved.id}", {"content": "x"}, format="json")
    problem(replaced, 405)
    saved.refresh_from_db()
    assert (saved.scope, saved.content) == ("user", "Alice prefers short answers")


def test_uses_name_the_runs_and_chats(viewer_client: APIClient) -> None:
    saved = item("public", "Fridays off")
    run_id = uuid.uuid4()
    memory_uses_record([saved], "injected", UseOrigin("agent:helper", run_id, "maker:0"))
    memory_uses_record([saved], "searched", UseOrigin("agent:helper", None, "chat", chat=True))
    uses = viewer_client.get(f"{URL}/{saved.id}/uses").json()["results"]
    assert [(u["kind"], u["run_id"], u["invocation"], u["chat"]) for u in uses] == [
        ("searched", None, "chat", True),
        ("injected", str(run_id), "maker:0", False),
        ("saved", None, "", False),
    ]
    problem(viewer_client.get(f"{URL}/{uuid.uuid4()}/uses"), 404)

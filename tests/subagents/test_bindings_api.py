"""``/api/v1/employees/{username}/sub-agents``: list, create, delete; strict input and
problem+json errors; the admin page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from orchestrator.agents.models import Employee, ModelEndpoint, SubAgentBinding

pytestmark = pytest.mark.django_db
PROBLEM = "application/problem+json"
URL = "/api/v1/employees/{}/sub-agents"


@pytest.fixture
def staff() -> dict[str, Employee]:
    endpoint = ModelEndpoint.objects.create(name="ep", base_url="http://127.0.0.1:9/v1", model="m")
    ModelEndpoint.objects.create(name="other-ep", base_url="http://127.0.0.1:9/v1", model="m2")
    return {
        name: Employee.objects.create(username=name, endpoint=endpoint)
        for name in ("boss", "helper", "spare", "spare2")
    }


@pytest.fixture
def operator(api_client_for: Callable[[str], APIClient]) -> APIClient:
    return api_client_for("operator")


def problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == PROBLEM
    body: dict[str, Any] = response.json()
    return body


def test_an_operator_binds_lists_and_removes_a_sub_agent(
    operator: APIClient, staff: dict[str, Employee]
) -> None:
    created = operator.post(
        URL.format("boss"),
        {"child": "helper", "endpoint": "other-ep", "model": "m3", "alternatives": ["spare"]},
        format="json",
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert {k: body[k] for k in ("child", "endpoint", "model", "alternatives")} == {
        "child": "helper",
        "endpoint": "other-ep",
        "model": "m3",
        "alternatives": ["spare"],
    }
    operator.post(URL.format("boss"), {"child": "spare2"}, format="json")
    listed = operator.get(URL.format("boss"))
    assert listed.status_code == 200
    assert [b["child"] for b in listed.json()] == ["helper", "spare2"]
    assert listed.json()[1]["endpoint"] is None and listed.json()[1]["alternatives"] == []
    assert operator.delete(URL.format("boss") + "/helper").status_code == 204
    assert [b.child.username for b in SubAgentBinding.objects.all()] == ["spare2"]
    gone = operator.delete(URL.format("boss") + "/helper")
    assert "not a sub-agent of boss" in problem(gone, 404)["detail"]


def test_bad_bindings_are_refused_with_pointers(
    operator: APIClient, staff: dict[str, Employee]
) -> None:
    url = URL.format("boss")
    assert operator.post(url, {"child": "helper"}, format="json").status_code == 201
    again = operator.post(url, {"child": "helper"}, format="json")
    assert "already a sub-agent of boss" in problem(again, 409)["detail"]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"child": "nobody"}, "/child"),
        ({"child": "boss"}, "/child"),
        ({"child": "spare", "alternatives": ["ghost"]}, "/alternatives"),
        ({"child": "spare", "alternatives": ["spare2", "spare2"]}, "/alternatives"),
        ({"child": "spare", "alternatives": ["spare"]}, "/alternatives"),
        ({"child": "spare", "endpoint": "nope"}, "/endpoint"),
        ({"child": "spare", "surprise": 1}, "/surprise"),
        ({"child": "spare", "alternatives": "spare2"}, "/alternatives"),
    ]
    for data, pointer in cases:
        body = problem(operator.post(url, data, format="json"), 400)
        assert pointer in {e["pointer"] for e in body["errors"]}, (data, body)
    missing = operator.get(URL.format("ghost"))
    assert "No AI employee named ghost" in problem(missing, 404)["detail"]


def test_a_viewer_reads_but_cannot_bind(
    api_client_for: Callable[[str], APIClient], staff: dict[str, Employee]
) -> None:
    viewer = api_client_for("viewer")
    assert viewer.get(URL.format("boss")).status_code == 200
    problem(viewer.post(URL.format("boss"), {"child": "helper"}, format="json"), 403)


def test_deleting_an_employee_removes_its_bindings(staff: dict[str, Employee]) -> None:
    SubAgentBinding.objects.create(parent=staff["boss"], child=staff["helper"])
    staff["helper"].delete()
    assert not SubAgentBinding.objects.exists()


def test_the_admin_lists_and_edits_bindings(staff: dict[str, Employee]) -> None:
    SubAgentBinding.objects.create(parent=staff["boss"], child=staff["helper"])
    admin = get_user_model().objects.create_superuser("root", "r@example.test", "pw")
    client = Client()
    client.force_login(admin)
    page = client.get("/admin/agents/subagentbinding/")
    assert page.status_code == 200 and b"helper" in page.content
    form = {
        "parent": staff["spare"].pk,
        "child": staff["helper"].pk,
        "model": "",
        "alternatives": '["boss"]',
    }
    assert client.post("/admin/agents/subagentbinding/add/", form).status_code == 302
    refused = client.post(
        "/admin/agents/subagentbinding/add/",
        {**form, "parent": staff["boss"].pk, "child": staff["boss"].pk, "alternatives": "[]"},
    )
    assert refused.status_code == 200
    assert SubAgentBinding.objects.filter(parent=staff["spare"]).get().alternatives == ["boss"]

"""The gateway's REST API: grants (admins write, any role reads; filters; conflicts), the
per-employee guardrail configuration (validated, stored in its API form) and the records of
chat completion requests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from gateway.models import ChatCompletionRecord, EmployeeGrant
from gateway.services import grant_create, guardrails_update
from orchestrator.accounts.services import user_ensure
from orchestrator.agents.models import Employee
from orchestrator.agents.services import employee_create, model_endpoint_create

pytestmark = pytest.mark.django_db
PROBLEM = "application/problem+json"


@pytest.fixture
def ada() -> Employee:
    endpoint = model_endpoint_create(name="offline", provider="scripted", script="demo")
    return employee_create(username="ada", endpoint=endpoint)


def test_admins_grant_and_withdraw(
    api_client_for: Callable[[str], APIClient], ada: Employee
) -> None:
    admin, viewer = api_client_for("admin"), api_client_for("viewer")
    user_ensure(username="alice")
    made = admin.post(
        "/api/v1/employee-grants", {"employee": "ada", "user": "alice"}, format="json"
    )
    assert made.status_code == 201, made.json()
    assert made.json()["created_by"] == "admin"
    again = admin.post(
        "/api/v1/employee-grants", {"employee": "ada", "user": "alice"}, format="json"
    )
    assert again.status_code == 409 and again["Content-Type"] == PROBLEM
    listed = viewer.get("/api/v1/employee-grants", {"employee": "ada"}).json()
    assert [(g["employee"], g["user"]) for g in listed["results"]] == [("ada", "alice")]
    assert viewer.get("/api/v1/employee-grants", {"user": "bob"}).json()["results"] == []
    refused = viewer.post(
        "/api/v1/employee-grants", {"employee": "ada", "user": "viewer"}, format="json"
    )
    assert refused.status_code == 403
    assert admin.delete(f"/api/v1/employee-grants/{made.json()['id']}").status_code == 204
    assert not EmployeeGrant.objects.exists()


def test_grant_bodies_are_strict(api_client_for: Callable[[str], APIClient], ada: Employee) -> None:
    admin = api_client_for("admin")
    typo = admin.post("/api/v1/employee-grants", {"employee": "ada", "usr": "x"}, format="json")
    assert typo.status_code == 400 and typo["Content-Type"] == PROBLEM
    pointers = {e["pointer"] for e in typo.json()["errors"]}
    assert "/usr" in pointers
    nobody = admin.post(
        "/api/v1/employee-grants", {"employee": "zed", "user": "admin"}, format="json"
    )
    assert nobody.status_code == 400
    assert nobody.json()["errors"][0]["pointer"] == "/employee"


def test_guardrails_are_validated_and_stored(
    api_client_for: Callable[[str], APIClient], ada: Employee
) -> None:
    admin, operator = api_client_for("admin"), api_client_for("operator")
    url = "/api/v1/employees/ada/guardrails"
    empty = operator.get(url).json()
    assert empty["employee"] == "ada" and empty["guardrails"]["input"] == []
    config = {"input": [{"name": "no-cards", "kind": "pii", "types": ["credit_card"]}]}
    assert operator.put(url, {"guardrails": config}, format="json").status_code == 403
    stored = admin.put(url, {"guardrails": config}, format="json")
    assert stored.status_code == 200, stored.json()
    assert stored.json()["guardrails"]["input"][0]["name"] == "no-cards"
    assert admin.get(url).json()["guardrails"] == stored.json()["guardrails"]
    bad = admin.put(url, {"guardrails": {"input": [{"name": "x", "kind": "nope"}]}}, format="json")
    assert bad.status_code == 400 and bad["Content-Type"] == PROBLEM
    assert bad.json()["errors"][0]["pointer"].startswith("/guardrails/input/0")
    assert admin.get("/api/v1/employees/zed/guardrails").status_code == 404


def test_records_are_listed_and_filtered(
    api_client_for: Callable[[str], APIClient], ada: Employee
) -> None:
    viewer = api_client_for("viewer")
    for index, (employee, status) in enumerate([("ada", "ok"), ("bob", "blocked")]):
        ChatCompletionRecord.objects.create(
            id=f"chatcmpl-{index:032x}",
            employee_username=employee,
            created_at=timezone.now(),
            status=status,
            guardrail_decisions=[{"stage": "input", "blocked": status == "blocked"}],
        )
    rows = viewer.get("/api/v1/chat-completions", {"employee": "bob"}).json()["results"]
    assert [(r["employee_username"], r["status"]) for r in rows] == [("bob", "blocked")]
    assert rows[0]["guardrail_decisions"] == [{"stage": "input", "blocked": True}]
    one = viewer.get(f"/api/v1/chat-completions/chatcmpl-{0:032x}")
    assert one.status_code == 200 and one.json()["employee_username"] == "ada"
    assert api_client_for("outsider").get("/api/v1/chat-completions").status_code == 403


def test_the_admin_lists_grants_settings_and_records(client: Any, ada: Employee) -> None:
    root = User.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(root)
    grant_create(employee=ada, user=root, actor="test")
    guardrails_update(employee=ada, guardrails={}, actor="test")
    ChatCompletionRecord.objects.create(
        id="chatcmpl-1", employee_username="ada", created_at=timezone.now(), status="ok"
    )
    for model in ("employeegrant", "employeechatsettings", "chatcompletionrecord"):
        assert client.get(f"/admin/gateway/{model}/").status_code == 200
    assert client.get("/admin/gateway/chatcompletionrecord/add/").status_code == 403

"""The employee page's OpenAI-compatible endpoint panel: the base URL and model with copyable
curl and ``openai`` examples, who may call the employee (admins grant and remove, through
``gateway.services``; problems at the field), and its latest chat completion records."""

from __future__ import annotations

import html
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from gateway.models import ChatCompletionRecord, EmployeeGrant
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import user_ensure
from orchestrator.agents.services import employee_create, model_endpoint_create

pytestmark = pytest.mark.django_db
ClientAs = Callable[[str], Client]


@pytest.fixture
def world() -> dict[str, Any]:
    endpoint = model_endpoint_create(name="offline", provider="scripted", script="demo")
    return {
        "mk": employee_create(username="mk", endpoint=endpoint),
        "other": employee_create(username="other", endpoint=endpoint),
        "alice": user_ensure(username="alice", roles=[Role.VIEWER]),
    }


def page(response: Any, status: int = 200) -> str:
    assert response.status_code == status, response.content[:2000]
    return html.unescape(response.content.decode())


def field_errors(text: str, field: str) -> str:
    start = text.find(f'id="field-{field}"')
    assert start >= 0, f"no field {field}"
    block = text[start : text.find("</div>", start)]
    return block.split('class="field-errors"')[1] if 'class="field-errors"' in block else ""


def test_the_page_shows_the_endpoint_with_curl_and_python_examples(
    client_as: ClientAs, world: dict[str, Any]
) -> None:
    text = page(client_as("viewer").get("/employees/mk", HTTP_HOST="lw.example:8443"))
    assert '<code id="chat-base-url">http://lw.example:8443/v1</code>' in text
    assert '<code id="chat-model">mk</code>' in text
    assert "curl http://lw.example:8443/v1/chat/completions" in text
    assert '"model": "mk"' in text and "Authorization: Bearer $LOOPWRIGHT_API_KEY" in text
    assert 'OpenAI(base_url="http://lw.example:8443/v1"' in text and 'model="mk"' in text
    assert 'data-copy="chat-example-curl"' in text and 'data-copy="chat-example-python"' in text
    assert "Nobody is granted this employee" in text
    assert "Grant access" not in text  # only admins grant
    assert "No chat completions yet." in text


def test_an_admin_grants_and_removes_access(client_as: ClientAs, world: dict[str, Any]) -> None:
    admin = client_as("admin")
    response = admin.post("/employees/mk/grants", {"username": "alice"})
    assert response.status_code == 302 and response["Location"] == "/employees/mk"
    grant = EmployeeGrant.objects.get(employee=world["mk"])
    assert (grant.user.username, grant.created_by) == ("alice", "admin")
    text = page(admin.get("/employees/mk"))
    assert "alice may now call mk." in text
    assert "<td>alice</td>" in text and 'aria-label="Remove alice"' in text
    assert "<td>alice</td>" not in page(client_as("viewer").get("/employees/other"))

    response = admin.post("/employees/mk/grants/alice/remove")
    assert response.status_code == 302
    assert not EmployeeGrant.objects.exists()
    assert "alice may no longer call mk." in page(admin.get("/employees/mk"))


def test_grant_problems_show_at_the_field_and_change_nothing(
    client_as: ClientAs, world: dict[str, Any]
) -> None:
    admin = client_as("admin")
    unknown = page(admin.post("/employees/mk/grants", {"username": "ghost"}), 400)
    assert "There is no user 'ghost'." in field_errors(unknown, "username")
    empty = page(admin.post("/employees/mk/grants", {"username": ""}), 400)
    assert "This field is required." in field_errors(empty, "username")
    assert not EmployeeGrant.objects.exists()

    assert admin.post("/employees/mk/grants", {"username": "alice"}).status_code == 302
    again = page(admin.post("/employees/mk/grants", {"username": "alice"}), 400)
    assert field_errors(again, "username")  # the service's conflict, at the field
    assert EmployeeGrant.objects.count() == 1

    removed_twice = admin.post("/employees/mk/grants/ghost/remove")
    assert removed_twice.status_code == 302
    assert "There is no user 'ghost'." in page(admin.get("/employees/mk"))
    assert admin.post("/employees/nobody/grants", {"username": "alice"}).status_code == 404


def test_only_admins_may_change_grants(client_as: ClientAs, world: dict[str, Any]) -> None:
    operator = client_as("operator")
    refused = operator.post("/employees/mk/grants", {"username": "alice"})
    assert refused.status_code == 403 and b"needs the admin role" in refused.content
    assert not EmployeeGrant.objects.exists()
    assert "Grant access" in page(client_as("admin").get("/employees/mk"))


def _record(employee: str, age_s: int, **fields: Any) -> ChatCompletionRecord:
    values: dict[str, Any] = {
        "id": f"chatcmpl-{employee}-{age_s}",
        "employee_username": employee,
        "created_at": timezone.now() - timedelta(seconds=age_s),
        "status": "ok",
        "finish_reason": "stop",
        **fields,
    }
    return ChatCompletionRecord.objects.create(**values)


def test_the_latest_chat_completions_of_the_employee_are_listed_newest_first(
    client_as: ClientAs, world: dict[str, Any]
) -> None:
    alice = get_user_model().objects.get(username="alice")
    _record("mk", 60, user=alice, prompt_tokens=12, completion_tokens=34, duration_ms=250)
    _record("mk", 5, stream=True, status="error", finish_reason="", error="model unavailable")
    _record("other", 1)
    text = page(client_as("viewer").get("/employees/mk"))
    assert "chatcmpl-other-1" not in text
    newer, older = text.find("chatcmpl-mk-5"), text.find("chatcmpl-mk-60")
    assert 0 < newer < older
    assert "12 / 34" in text and "250 ms" in text and "model unavailable" in text
    assert '<span class="badge badge-bad">error</span>' in text

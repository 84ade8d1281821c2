"""Query and body input the views read themselves is bounded (issue 19): 400, never 500."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from rest_framework.test import APIClient

from loops.models import LoopRun
from loops.triggers.events import event_key_create
from tests.support.factories import make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(api_client_for: Callable[[str], APIClient]) -> APIClient:
    return api_client_for("operator")


@pytest.mark.parametrize("after", ["1" + "0" * 30, "-1", "x"])
def test_a_run_events_cursor_out_of_range_is_a_400_naming_it(
    operator: APIClient, after: str
) -> None:
    run = make_run()
    response = operator.get(f"/api/v1/runs/{run.id}/events", {"after_seq": after})
    assert response.status_code == 400, response.content
    assert response.json()["errors"][0]["pointer"] == "/after_seq"
    assert operator.get(f"/api/v1/runs/{run.id}/events", {"after_seq": "0"}).status_code == 200


@pytest.mark.parametrize("sub", ["events", "steps"])
@pytest.mark.parametrize("query", [{"limit": "-1"}, {"limit": "1001"}, {"offset": "-1"}])
def test_a_run_sub_resource_page_out_of_range_is_a_400_naming_it(
    operator: APIClient, sub: str, query: dict[str, str]
) -> None:
    run = make_run()
    response = operator.get(f"/api/v1/runs/{run.id}/{sub}", query)
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["errors"][0]["pointer"] == f"/{next(iter(query))}"


def test_run_sub_resources_take_no_run_list_filters(operator: APIClient) -> None:
    run = make_run()
    odd = {"created_after": "4131-02-25T10:35:50-17:34", "status": "nonsense"}
    for sub in ("steps", "artifacts", "events"):
        response = operator.get(f"/api/v1/runs/{run.id}/{sub}", odd)
        assert response.status_code == 200, (sub, response.content)
    assert isinstance(operator.get(f"/api/v1/runs/{run.id}/artifacts").json(), list)


def test_a_webhook_payload_nested_too_deep_or_with_nul_is_a_400(operator: APIClient) -> None:
    event_key_create(key="deploy", actor="admin")
    deep = "[" * 5000 + "]" * 5000
    for body in ('{"a": ' + deep + "}", '{"note": "a\\u0000b"}'):
        response = operator.generic(
            "POST", "/api/v1/events/deploy", body, content_type="application/json"
        )
        assert response.status_code == 400, response.content
        assert response["Content-Type"].startswith("application/problem+json")
    assert not LoopRun.objects.exists()


def test_event_keys_refuse_unknown_fields(api_client_for: Callable[[str], APIClient]) -> None:
    admin = api_client_for("admin")
    response = admin.post("/api/v1/event-keys", {"key": "deploy", "enabeld": False}, format="json")
    assert response.status_code == 400, response.content
    assert "enabeld" in response.content.decode()

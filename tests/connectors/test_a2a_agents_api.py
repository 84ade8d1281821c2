"""``/api/v1/a2a-agents``: registering a real A2A agent reads its card at once (the connection
test) and offers it as ``a2a__<name>`` with the trust tier the admin chose; secrets stay in
environment variables; the outbound guard refuses a URL before anything is stored; an agent
that is down is reported, its card kept."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from connectors.models import A2AAgent
from tests.support.a2a_agent import AgentLog, a2a_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def _register(client: APIClient, **body: Any) -> Any:
    return client.post("/api/v1/a2a-agents", body, format="json")


def test_registering_reads_the_card(
    api_client_for: Callable[[str], APIClient], helper_agent: tuple[str, AgentLog]
) -> None:
    url, _ = helper_agent
    admin = api_client_for("admin")
    response = _register(admin, name="helper", card_url=url, effect="read")
    assert response.status_code == 201, response.content
    assert response.data["card"]["name"] == "Scripted agent"
    assert response.data["card"]["capabilities"]["streaming"] is True
    assert response.data["offered_as"] == "a2a__helper"
    assert response.data["effect"] == "read" and response.data["card_error"] == ""
    # The card's own URL works as well as the agent's base URL.
    card_url = f"{url}/.well-known/agent-card.json"
    direct = _register(admin, name="direct", card_url=card_url)
    assert direct.status_code == 201 and direct.data["card_error"] == "", direct.content
    assert direct.data["effect"] == "write"  # the default tier

    assert api_client_for("viewer").get("/api/v1/a2a-agents/helper").status_code == 200
    assert _register(api_client_for("operator"), name="x", card_url=url).status_code == 403
    changed = admin.patch("/api/v1/a2a-agents/helper", {"effect": "external"}, format="json")
    assert changed.status_code == 200 and changed.data["effect"] == "external"
    renamed = admin.patch("/api/v1/a2a-agents/helper", {"name": "other"}, format="json")
    assert renamed.status_code == 400 and renamed["content-type"] == "application/problem+json"
    unknown = _register(admin, name="y", card_url=url, effect="root")
    assert unknown.status_code == 400 and "effect" in str(unknown.content)
    assert admin.delete("/api/v1/a2a-agents/direct").status_code == 204


def test_the_outbound_guard_refuses_a_url_with_its_reason(
    api_client_for: Callable[[str], APIClient],
) -> None:
    admin = api_client_for("admin")
    for url in ("http://169.254.169.254/latest", "ftp://agents.example/card"):
        response = _register(admin, name="meta", card_url=url)
        assert response.status_code == 400, response.content
        assert response["content-type"] == "application/problem+json"
        assert "card_url" in str(response.content)
    assert not A2AAgent.objects.exists()


def test_header_values_come_from_allowed_environment_variables_only(
    api_client_for: Callable[[str], APIClient],
    helper_agent: tuple[str, AgentLog],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, log = helper_agent
    admin = api_client_for("admin")
    for variable in ("DATABASE_URL", "sekrit-value"):
        response = _register(admin, name="keyed", card_url=url, headers={"X-Key": variable})
        assert response.status_code == 400, response.content
        assert response["content-type"] == "application/problem+json"
    assert not A2AAgent.objects.exists()

    body = {"name": "keyed", "card_url": url, "headers": {"X-Key": "LOOPWRIGHT_SECRET_AGENT"}}
    unset = _register(admin, **body)
    assert unset.status_code == 201
    assert unset.data["headers_configured"] == {"X-Key": False}
    assert "LOOPWRIGHT_SECRET_AGENT is not set" in unset.data["card_error"]
    assert unset.data["offered_as"] is None

    monkeypatch.setenv("LOOPWRIGHT_SECRET_AGENT", "sekrit")
    read = admin.post("/api/v1/a2a-agents/keyed/refresh")
    assert read.status_code == 200 and read.data["card_error"] == "", read.content
    assert log.headers[-1]["x-key"] == "sekrit"
    assert "sekrit" not in str(read.content)


def test_an_agent_that_is_down_is_reported_and_its_card_kept(
    api_client_for: Callable[[str], APIClient],
) -> None:
    admin = api_client_for("admin")
    with a2a_agent() as (url, _):
        assert _register(admin, name="gone", card_url=url).status_code == 201
    down = admin.post("/api/v1/a2a-agents/gone/refresh")
    assert down.status_code == 200
    assert down.data["card_error"] and down.data["card"]["name"] == "Scripted agent"

"""The A2A agents pages: every role sees the registered agents (the tool each is offered as, its
trust tier, its card's skills); an admin registers one (its card is read at once from a real
``a2a-sdk`` agent on loopback) and tests the connection again; problems at their fields."""

from __future__ import annotations

import html
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import Client

from connectors.a2a_services import a2a_agent_create
from connectors.models import A2AAgent
from tests.support.a2a_agent import AgentLog, a2a_agent

pytestmark = pytest.mark.django_db(transaction=True)
ClientAs = Callable[[str], Client]


@pytest.fixture
def agent() -> Iterator[tuple[str, AgentLog]]:
    with a2a_agent() as running:
        yield running


def page(response: Any, status: int = 200) -> str:
    assert response.status_code == status, response.content[:2000]
    return html.unescape(response.content.decode())


def test_an_admin_registers_an_agent_and_sees_its_card(
    client_as: ClientAs, agent: tuple[str, AgentLog]
) -> None:
    admin = client_as("admin")
    form = {"name": "helper", "card_url": agent[0], "headers": "", "timeout_seconds": "30",
            "effect": "read"}  # fmt: skip
    text = page(admin.post("/a2a-agents", form, follow=True))
    assert "helper: card read (Scripted agent)." in text
    assert "<code>a2a__helper</code>" in text and "streams its task updates" in text
    assert "Scripted" in text  # the skill's description
    assert A2AAgent.objects.get(name="helper").effect == "read"
    listing = page(admin.get("/a2a-agents"))
    assert 'id="a2a-agent-helper"' in listing and 'aria-current="page"' in listing


def test_readers_see_agents_but_only_admins_register_or_refresh(
    client_as: ClientAs, agent: tuple[str, AgentLog]
) -> None:
    a2a_agent_create(name="helper", card_url=agent[0], headers={"X-Key": "LOOPWRIGHT_SECRET_NO_X"})
    viewer = client_as("viewer")
    listing = page(viewer.get("/a2a-agents"))
    assert 'id="a2a-agent-helper"' in listing and "Register an A2A agent" not in listing
    detail = page(viewer.get("/a2a-agents/helper"))
    assert "<code>X-Key</code> from <code>LOOPWRIGHT_SECRET_NO_X</code>" in detail
    assert "not set" in detail and "Test the connection" not in detail
    assert viewer.post("/a2a-agents/helper/refresh").status_code == 403
    assert viewer.post("/a2a-agents", {"name": "x"}).status_code == 403


def test_bad_input_is_shown_at_its_field(client_as: ClientAs, db: None) -> None:
    admin = client_as("admin")
    form = {"name": "Bad Name", "card_url": "http://169.254.169.254/card.json",
            "headers": "no colon here", "timeout_seconds": "0", "effect": "write"}  # fmt: skip
    text = page(admin.post("/a2a-agents", form), status=400)
    assert "Line 1: write Header-Name: VARIABLE." in text
    assert "Ensure this value is greater than or equal to 1." in text
    assert not A2AAgent.objects.exists()
    refused = {**form, "name": "meta", "headers": "", "timeout_seconds": "5"}
    text = page(admin.post("/a2a-agents", refused), status=400)
    assert "169.254.169.254" in text and not A2AAgent.objects.exists()
    assert page(admin.get("/a2a-agents/nobody"), status=404)

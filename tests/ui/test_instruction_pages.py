"""The Instructions pages (test client, no browser): the list and its create form, one
instruction's versions, text, diff and where-used, and an admin's draft and publish."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from instructions.models import Instruction
from instructions.services import instruction_create, instruction_publish, instruction_save_draft
from orchestrator.agents.services import employee_create, model_endpoint_create

pytestmark = pytest.mark.django_db
ClientAs = Callable[[str], Client]


@pytest.fixture
def tone() -> Instruction:
    instruction_create(name="tone", description="how to sound", text="Be brief.\nBe kind.\n")
    instruction_publish(name="tone")
    instruction_save_draft(name="tone", text="Be brief.\nBe warm.\n", note="warmer")
    endpoint = model_endpoint_create(name="offline", provider="scripted", script="demo")
    employee_create(username="ada", endpoint=endpoint, system_prompt="${instructions.tone}")
    return Instruction.objects.get(name="tone")


def page(response: Any, status: int = 200) -> str:
    assert response.status_code == status, response.content[:2000]
    return str(response.content.decode())


def test_a_viewer_reads_the_list_the_versions_the_diff_and_where_used(
    client_as: ClientAs, tone: Instruction
) -> None:
    client = client_as("viewer")
    listed = page(client.get("/instructions"))
    assert 'href="/instructions/tone"' in listed and "how to sound" in listed
    assert 'aria-current="page"' in listed and "New instruction" not in listed
    detail = page(client.get("/instructions/tone?from=1&to=2"))
    assert "Text of v1" in detail and "Be kind." in detail
    assert '<span class="diff-add">+Be warm.' in detail
    assert 'href="/employees/ada"' in detail
    assert "Save draft" not in detail and "Publish v2" not in detail
    assert "Be warm." in page(client.get("/instructions/tone?version=2"))
    page(client.get("/instructions/ghost"), 404)


def test_an_admin_creates_saves_a_draft_and_publishes(client_as: ClientAs) -> None:
    client = client_as("admin")
    assert "New instruction" in page(client.get("/instructions"))
    refused = page(client.post("/instructions", {"name": "Bad Name"}), 400)
    assert "field-invalid" in refused
    response = client.post("/instructions", {"name": "style", "text": "Use lists."})
    assert response.status_code == 302 and response["Location"] == "/instructions/style"
    detail = page(client.get("/instructions/style"))
    assert "Publish v1" in detail and "Save draft" in detail
    assert client.post("/instructions/style/publish", {"version": "1"}).status_code == 302
    assert client.post("/instructions/style/draft", {"text": "Use tables."}).status_code == 302
    assert page(client.post("/instructions/style/draft", {"text": "x" * 100_001}), 400)
    instruction = Instruction.objects.get(name="style")
    assert instruction.current_version is not None
    assert instruction.current_version.text == "Use lists."
    assert instruction.versions.get(version=2).text == "Use tables."

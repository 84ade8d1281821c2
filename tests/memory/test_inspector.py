"""The Memory Inspector pages: every role lists, searches and reads items with their uses;
operators edit content and tags and delete (viewers are refused and nothing changes); problems
show at their fields."""

from __future__ import annotations

import html
import uuid
from typing import Any

import pytest
from django.test import Client

from memory.models import MemoryItem, MemoryUse
from memory.services import UseOrigin, memory_uses_record
from orchestrator.accounts.services import user_ensure
from tests.conftest import PERSONAS
from tests.memory.conftest import ClientAs, item

pytestmark = pytest.mark.django_db


def page(response: Any, status: int = 200) -> str:
    assert response.status_code == status, response.content[:2000]
    return html.unescape(response.content.decode())


def test_the_list_searches_and_filters_by_scope(client_as: ClientAs) -> None:
    public = item("public", "The office is closed on Fridays")
    alice = item("user", "Alice prefers short answers", user="alice", tags=["style"])
    viewer = client_as("viewer")
    listing = page(viewer.get("/memory"))
    assert f'id="memory-{public.id}"' in listing and f'id="memory-{alice.id}"' in listing
    found = page(viewer.get("/memory", {"q": "SHORT answers"}))
    assert f'id="memory-{alice.id}"' in found and f'id="memory-{public.id}"' not in found
    scoped = page(viewer.get("/memory", {"scope": "public"}))
    assert f'id="memory-{public.id}"' in scoped and f'id="memory-{alice.id}"' not in scoped
    assert "No memory items match these filters" in page(viewer.get("/memory", {"q": "zebra"}))
    assert f'id="memory-{alice.id}"' in page(viewer.get("/memory", {"q": "style"}))


def test_an_item_page_shows_content_tags_and_uses_linking_runs(client_as: ClientAs) -> None:
    saved = item("agent_user", "Alice's repo is lw-core", user="alice", employee="helper",
                 tags=["repo"])  # fmt: skip
    run_id = uuid.uuid4()
    memory_uses_record([saved], "injected", UseOrigin("agent:helper", run_id, "maker:0"))
    memory_uses_record([saved], "searched", UseOrigin("agent:helper", None, "chat", chat=True))
    text = page(client_as("viewer").get(f"/memory/{saved.id}"))
    assert "Alice's repo is lw-core" in text and "<code>repo</code>" in text
    assert f'href="/runs/{run_id}"' in text and "(maker:0)" in text and "a chat" in text
    assert "Delete" not in text and 'action="/memory/' not in text  # a viewer gets no forms
    assert 'id="memory-delete"' in page(client_as("operator").get(f"/memory/{saved.id}"))


def test_unknown_items_are_not_found(client_as: ClientAs) -> None:
    viewer = client_as("viewer")
    page(viewer.get(f"/memory/{uuid.uuid4()}"), 404)
    page(viewer.get("/memory/not-a-uuid"), 404)


def test_an_operator_edits_and_problems_show_at_their_fields(client_as: ClientAs) -> None:
    saved = item("user", "Alice is in Berlin", user="alice")
    operator = client_as("operator")
    edited = operator.post(f"/memory/{saved.id}/edit",
                           {"content": "Alice is in Paris", "tags": "city, travel"}, follow=True)  # fmt: skip
    assert "Memory item saved." in page(edited)
    saved.refresh_from_db()
    assert (saved.content, saved.tags) == ("Alice is in Paris", ["city", "travel"])
    assert MemoryUse.objects.filter(item=saved, kind="edited", actor="operator").exists()

    blank = page(operator.post(f"/memory/{saved.id}/edit", {"content": "   ", "tags": ""}), 400)
    assert "The content is empty." in blank
    tags = page(operator.post(f"/memory/{saved.id}/edit", {"content": "x", "tags": "a, a"}), 400)
    assert "Tags must be distinct." in tags
    saved.refresh_from_db()
    assert saved.content == "Alice is in Paris"


def test_viewers_cannot_edit_or_delete(client_as: ClientAs) -> None:
    saved = item("public", "Fridays off")
    viewer = client_as("viewer")
    assert "operator" in page(viewer.post(f"/memory/{saved.id}/edit", {"content": "x"}), 403)
    page(viewer.post(f"/memory/{saved.id}/delete"), 403)
    page(client_as("operator").get(f"/memory/{saved.id}/delete"), 405)
    assert MemoryItem.objects.get().content == "Fridays off"


def test_the_delete_form_needs_its_csrf_token(db: None) -> None:
    saved = item("public", "Fridays off")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user_ensure(username="operator", roles=PERSONAS["operator"]))
    assert client.post(f"/memory/{saved.id}/delete").status_code == 403
    assert MemoryItem.objects.exists()
    detail = page(client.get(f"/memory/{saved.id}"))
    token = detail.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
    deleted = client.post(f"/memory/{saved.id}/delete", {"csrfmiddlewaretoken": token})
    assert deleted.status_code == 302 and deleted["Location"] == "/memory"
    assert not MemoryItem.objects.exists()

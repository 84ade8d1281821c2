"""Agent memory's test parts: items made through the services, and UI clients of personas."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from memory.models import MemoryItem
from memory.services import memory_create
from orchestrator.accounts.services import user_ensure
from tests.conftest import PERSONAS

ClientAs = Callable[[str], Client]


def item(
    scope: str, content: str, *, user: str = "", employee: str = "", **fields: Any
) -> MemoryItem:
    """An item saved through the services by a person (``tester``)."""
    return memory_create(
        scope=scope,
        content=content,
        username=user,
        employee=employee,
        created_by=fields.pop("created_by", "tester"),
        **fields,
    )


@pytest.fixture
def client_as(db: None) -> ClientAs:
    """``client_as("viewer")``: a Django test client logged in as that persona."""

    def make(persona: str) -> Client:
        client = Client()
        client.force_login(user_ensure(username=persona, roles=PERSONAS[persona]))
        return client

    return make

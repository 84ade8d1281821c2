"""End to end: a memory saved in one run is given to the next run of the same employee for the
same person, within the role's harness budget; deleting it in the Memory Inspector (its delete
form) keeps it out of the run after.

Runs are driven in this process by the real engine (``loops.worker.engine.drive_run``) with the
production invoker (``AgentInvoker``: the employee's prompt with the memory block, the
production tool registry with the memory tools, the harness plan), against the scripted model
on loopback HTTP (``tests/support/model_server.py``); what the model received is read from the
server's recorded requests. ``memory_save`` is a write, so at autonomy L1 it waits for a person's
approval, given through the API.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
from django.db import DEFAULT_DB_ALIAS, connections
from rest_framework.test import APIClient

from harness.services import profile_create
from loops.models import LoopPattern, LoopRun, RunStatus
from loops.services.claims import run_claim
from loops.services.runs import run_trigger
from loops.worker.engine import drive_run
from loops.worker.invoker import AgentInvoker
from memory.models import MemoryItem, MemoryUse
from memory.services import BLOCK_CLOSE, BLOCK_OPEN
from orchestrator.agents.services import employee_create, model_endpoint_create
from tests.memory.conftest import ClientAs, item
from tests.support.approvals import (
    LEADER,
    MAKER,
    VERIFIER,
    InlineDriver,
    approval_pattern,
    pending_approvals,
    role_of,
)
from tests.support.model_server import ModelServer

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
    pytest.mark.timeout(300),
]
PERSON = "alice"
FACT = "Alice deploys on Tuesdays at 14:00 UTC"
#: The maker's harness: one item, at most this many characters of block.
MAX_CHARS = 200


@pytest.fixture
def pattern(role_model: ModelServer) -> LoopPattern:
    endpoint = model_endpoint_create(
        name="memory-loopback", provider="openai", base_url=role_model.url, model="memory-script",
        max_retries=0, timeout_seconds=60,
    )  # fmt: skip
    employee_create(username=LEADER, endpoint=endpoint, tools=["read", "list"])
    employee_create(username=MAKER, endpoint=endpoint,
                    tools=["memory_save", "memory_search", "memory_delete"])  # fmt: skip
    employee_create(username=VERIFIER, endpoint=endpoint, tools=["read"])
    profile_create(tag="memory-small", settings={"memory": {"maxItems": 1, "maxChars": MAX_CHARS}})
    return approval_pattern("memory-e2e", maker_harness_tag="memory-small")


def drive(run_id: uuid.UUID) -> str:
    """Claim the run and drive it with the production invoker until it ends or parks."""
    [claim] = run_claim(owner="memory-engine", lease_seconds=300, run_id=run_id)
    driver = InlineDriver(AgentInvoker())  # type: ignore[arg-type]
    outer = connections[DEFAULT_DB_ALIAS]

    async def main() -> None:
        connections[DEFAULT_DB_ALIAS] = outer  # the engine writes on this thread's connection
        await drive_run(driver, claim)  # type: ignore[arg-type]

    with mock.patch.dict(os.environ, {"DJANGO_ALLOW_ASYNC_UNSAFE": "true"}):
        asyncio.run(main())
    return str(LoopRun.objects.get(pk=run_id).status)


def trigger(pattern: LoopPattern, label: str, *rounds: list[Any]) -> LoopRun:
    inputs = {"label": label, "rounds": [list(r) for r in rounds]}
    return run_trigger(pattern=pattern, actor=PERSON, inputs=inputs)


def maker_memory_blocks(role_model: ModelServer, label: str) -> list[str]:
    """The memory block of each system prompt the maker of run ``label`` sent ("" for none)."""
    blocks = []
    for body in role_model.bodies:
        messages = body["messages"]
        if role_of(messages) != "maker" or f"Approvals test {label}" not in json.dumps(messages):
            continue
        system = str(messages[0]["content"])
        start = system.find(BLOCK_OPEN)
        blocks.append(
            "" if start < 0 else system[start : system.index(BLOCK_CLOSE) + len(BLOCK_CLOSE)]
        )
    assert blocks, f"the maker of {label} sent no request"
    return blocks


def test_a_saved_memory_reaches_the_next_run_within_budget_until_deleted(
    role_model: ModelServer,
    pattern: LoopPattern,
    api_client_for: Callable[[str], APIClient],
    client_as: ClientAs,
) -> None:
    older = item("agent_user", "Alice prefers vim", user=PERSON, employee=MAKER)

    # Run 1: the maker (given the older item) saves a fact; a person approves the write.
    save = [["memory_save", {"content": FACT, "tags": ["deploys"]}]]
    first = trigger(pattern, "first", save)
    assert drive(first.id) == RunStatus.WAITING_APPROVAL
    [approval] = pending_approvals(first)
    assert approval.tool_name == "memory_save"
    decided = api_client_for("approver").post(
        f"/api/v1/approvals/{approval.id}/decide", {"decision": "approve"}, format="json"
    )
    assert decided.status_code == 200, decided.content
    assert drive(first.id) == RunStatus.SUCCEEDED
    saved = MemoryItem.objects.get(content=FACT)
    assert (saved.scope, saved.username, saved.employee, saved.source_run) == (
        "agent_user", PERSON, MAKER, first.id,
    )  # fmt: skip
    assert set(maker_memory_blocks(role_model, "first")) == {
        f"{BLOCK_OPEN}\n- [agent_user] Alice prefers vim\n{BLOCK_CLOSE}"
    }

    # Run 2, same employee and person: the new fact is given, and (maxItems 1) nothing else.
    second = trigger(pattern, "second")
    assert drive(second.id) == RunStatus.SUCCEEDED
    [block] = set(maker_memory_blocks(role_model, "second"))
    assert block == f"{BLOCK_OPEN}\n- [agent_user] {FACT}\n{BLOCK_CLOSE}"
    assert len(block) <= MAX_CHARS
    injected = MemoryUse.objects.filter(kind="injected", item=saved)
    assert [(u.run_id, u.invocation) for u in injected] == [(second.id, "maker:0")]
    # The leader and verifier are other employees: they are not given the maker's memory.
    assert all(BLOCK_OPEN not in str(b["messages"][0]["content"]) for b in role_model.bodies
               if role_of(b["messages"]) != "maker")  # fmt: skip

    # Someone else's run of the same pattern does not get Alice's memory.
    other = run_trigger(pattern=pattern, actor="bob", inputs={"label": "bob", "rounds": []})
    assert drive(other.id) == RunStatus.SUCCEEDED
    assert set(maker_memory_blocks(role_model, "bob")) == {""}

    # An operator deletes it in the Memory Inspector; the next run is given the older item.
    inspector = client_as("operator")
    page = inspector.get(f"/memory/{saved.id}")
    assert page.status_code == 200 and FACT in page.content.decode()
    assert f"/runs/{second.id}" in page.content.decode()  # the use links to the run
    deleted = inspector.post(f"/memory/{saved.id}/delete")
    assert deleted.status_code == 302, deleted.content
    assert not MemoryItem.objects.filter(pk=saved.pk).exists()
    third = trigger(pattern, "third")
    assert drive(third.id) == RunStatus.SUCCEEDED
    assert set(maker_memory_blocks(role_model, "third")) == {
        f"{BLOCK_OPEN}\n- [agent_user] Alice prefers vim\n{BLOCK_CLOSE}"
    }
    assert MemoryUse.objects.filter(kind="injected", item=older, run_id=third.id).exists()

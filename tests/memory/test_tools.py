"""The memory tools with a real ToolContext and Invocation: the harness ``memory`` section binds
each call (refusals name the setting), a search sees only what the scopes allow and at most
``maxItems``, a save re-issued after a crash saves once, a delete only reaches visible items;
every use is recorded with the run and invocation."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from memory.models import MemoryItem, MemoryUse
from memory.tools import DELETE, MEMORY_TOOLS, SAVE, SEARCH
from runtime.tools.base import Invocation, ToolContext, ToolError, ToolResult
from runtime.tools.registry import tool_providers
from runtime.types import Effect
from tests.memory.conftest import item

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
RUN = uuid.UUID("00000000-0000-4000-8000-000000000001")
ON = {"enabled": True, "write": True, "scopes": ["agent_user", "public", "user"],
      "maxItems": 20, "maxChars": 4000}  # fmt: skip


def invocation(user: str = "alice", name: str = "maker:0", **memory: Any) -> Invocation:
    return Invocation(
        run_id=RUN,
        role="maker",
        name=name,
        employee="helper",
        harness={"memory": {**ON, **memory}},
        harness_provenance={"memory.write": "profile:no-writes@1"},
        user=user,
    )


def call(
    name: str, arguments: dict[str, Any], who: Invocation | None, key: str = f"{RUN}:3:0",
    *, reissued: bool = False,
) -> ToolResult:  # fmt: skip
    tool = MEMORY_TOOLS.get(name)
    assert tool is not None
    context = ToolContext(workdir=None, idempotency_key=key, deadline=time.monotonic() + 30,
                          reissued=reissued, invocation=who)  # fmt: skip
    return asyncio.run(tool.run(arguments, context))


def refusal(name: str, arguments: dict[str, Any], who: Invocation | None) -> str:
    with pytest.raises(ToolError) as refused:
        call(name, arguments, who)
    return str(refused.value)


def test_the_tools_are_in_the_production_registry_with_their_effects() -> None:
    assert MEMORY_TOOLS in tool_providers()
    effects = {s.name: s.effect for s in MEMORY_TOOLS.specs()}
    assert effects == {SEARCH: Effect.READ, SAVE: Effect.WRITE, DELETE: Effect.WRITE}
    assert MEMORY_TOOLS.review_gates([SEARCH, SAVE]) == {}


def test_a_save_lands_in_its_scope_and_is_recorded_with_the_run() -> None:
    saved = call(SAVE, {"content": "Alice's repo is lw-core", "tags": ["repo"]}, invocation())
    assert not saved.is_error and "scope agent_user" in saved.content
    row = MemoryItem.objects.get()
    assert (row.scope, row.username, row.employee, row.created_by, row.source_run, row.tags) == (
        "agent_user", "alice", "helper", "agent:helper", RUN, ["repo"],
    )  # fmt: skip
    [use] = MemoryUse.objects.all()
    assert (use.kind, use.run_id, use.invocation, use.chat) == ("saved", RUN, "maker:0", False)
    call(SAVE, {"content": "Office closed Fridays", "scope": "public"}, invocation(), key="k2")
    public = MemoryItem.objects.get(scope="public")
    assert (public.username, public.employee) == ("", "")


def test_a_save_reissued_after_a_crash_saves_once() -> None:
    first = call(SAVE, {"content": "Alice is in Paris"}, invocation())
    again = call(SAVE, {"content": "Alice is in Paris"}, invocation(), reissued=True)
    # An approval extends the key; the call is still the same one.
    approved = call(SAVE, {"content": "Alice is in Paris"}, invocation(),
                    key=f"{RUN}:3:0:approval:9")  # fmt: skip
    assert MemoryItem.objects.count() == 1
    item_id = str(MemoryItem.objects.get().id)
    assert item_id in first.content and item_id in again.content and item_id in approved.content
    assert "not saved twice" in again.content
    assert MemoryUse.objects.filter(kind="saved").count() == 1
    call(SAVE, {"content": "Alice is in Paris"}, invocation(), key=f"{RUN}:4:0")  # another call
    assert MemoryItem.objects.count() == 2


def test_the_harness_binds_every_call_and_refusals_name_the_setting() -> None:
    no_read = invocation(enabled=False)
    assert "memory.enabled" in refusal(SEARCH, {"query": "alice"}, no_read)
    no_write = invocation(write=False)
    message = refusal(SAVE, {"content": "x"}, no_write)
    assert "memory.write (set by profile:no-writes@1)" in message
    assert "memory.write" in refusal(DELETE, {"id": str(uuid.uuid4())}, no_write)
    narrow = invocation(scopes=["agent_user"])
    assert "memory.scopes" in refusal(SAVE, {"content": "x", "scope": "public"}, narrow)
    assert "memory.scopes" in refusal(SEARCH, {"query": "x", "scope": "user"}, narrow)
    assert "no user" in refusal(SAVE, {"content": "x"}, invocation(user=""))
    assert "memory.maxItems" in refusal(SEARCH, {"query": "x"}, invocation(maxItems=0))
    assert "only inside a run" in refusal(SEARCH, {"query": "x"}, None)
    # A role without a harness snapshot: everything off.
    bare = Invocation(run_id=RUN, role="maker", name="maker:0", employee="helper", user="alice")
    assert "memory.enabled" in refusal(SEARCH, {"query": "x"}, bare)
    assert "memory.write" in refusal(SAVE, {"content": "x"}, bare)
    assert not MemoryItem.objects.exists()


def test_a_search_sees_its_scopes_ranks_and_stops_at_max_items() -> None:
    mine = item("agent_user", "Alice's repo is lw-core", user="alice", employee="helper")
    item("agent_user", "Alice's repo is secret", user="alice", employee="other")
    item("user", "Bob's repo is lw-bob", user="bob")
    public = item("public", "Every repo needs a README")
    found = call(SEARCH, {"query": "repo"}, invocation())
    assert str(mine.id) in found.content and str(public.id) in found.content
    assert "secret" not in found.content and "lw-bob" not in found.content
    assert found.content.startswith('2 memory items match "repo"')
    asked_one = call(SEARCH, {"query": "repo", "limit": 1}, invocation())
    assert asked_one.content.startswith('1 memory item matches "repo"')
    one = call(SEARCH, {"query": "repo", "limit": 5}, invocation(maxItems=1))
    assert one.content.startswith('1 memory item matches "repo"')
    only_public = call(SEARCH, {"query": "repo", "scope": "public"}, invocation())
    assert str(public.id) in only_public.content and str(mine.id) not in only_public.content
    # Without a person only public items are searched.
    assert str(mine.id) not in call(SEARCH, {"query": "repo"}, invocation(user="")).content
    assert call(SEARCH, {"query": "zebra"}, invocation()).content == 'No memory matches "zebra".'
    uses = MemoryUse.objects.filter(kind="searched", item=mine)
    assert {(u.run_id, u.invocation, u.actor) for u in uses} == {(RUN, "maker:0", "agent:helper")}


def test_a_chat_search_is_recorded_as_a_chat() -> None:
    saved = item("user", "Alice prefers short answers", user="alice")
    call(SEARCH, {"query": "short"}, invocation(name="chat"))
    use = MemoryUse.objects.get(kind="searched", item=saved)
    assert (use.run_id, use.chat, use.invocation) == (None, True, "chat")


def test_a_delete_reaches_only_items_the_invocation_can_see() -> None:
    mine = item("agent_user", "Alice's repo is lw-core", user="alice", employee="helper")
    theirs = item("agent_user", "Alice's repo is secret", user="alice", employee="other")
    public = item("public", "Every repo needs a README")
    assert "No memory item" in refusal(DELETE, {"id": str(theirs.id)}, invocation())
    narrow = invocation(scopes=["agent_user"])
    assert "memory.scopes" in refusal(DELETE, {"id": str(public.id)}, narrow)
    assert "UUID" in refusal(DELETE, {"id": "not-an-id"}, invocation())
    deleted = call(DELETE, {"id": str(mine.id)}, invocation())
    assert f"Deleted memory item {mine.id}" in deleted.content
    assert set(MemoryItem.objects.values_list("id", flat=True)) == {theirs.id, public.id}

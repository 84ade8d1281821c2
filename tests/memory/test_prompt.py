"""The ``<agent_memory_context>`` block a role's prompt gets (``memory/prompt.py``): under the
harness ``memory`` section, for the person the work is for; one ``injected`` use per item given,
with the run (or as a chat); nothing when memory is off."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from memory.models import MemoryUse
from memory.prompt import MEMORY_PROMPT
from runtime import prompt_context
from runtime.invocation import InvocationRequest, LoopRole
from tests.memory.conftest import item

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
RUN = uuid.uuid4()
ON = {"enabled": True, "write": True, "scopes": ["agent_user", "public", "user"],
      "maxItems": 20, "maxChars": 4000}  # fmt: skip


def request(
    user: str = "alice", memory: dict[str, Any] | None = None, **fields: Any
) -> InvocationRequest:
    settings = {} if memory is None else {"memory": memory}
    return InvocationRequest(
        run_id=RUN, role=LoopRole.MAKER, invocation="maker:0", employee_username="helper",
        goal="Help", harness={"settings": settings}, user=user, **fields,
    )  # fmt: skip


def block(req: InvocationRequest) -> str:
    return asyncio.run(MEMORY_PROMPT.prompt_block(req))


def test_the_block_holds_what_the_employee_may_see_for_the_person() -> None:
    mine = item("agent_user", "Alice's repo is lw-core", user="alice", employee="helper")
    item("agent_user", "Alice likes tabs", user="alice", employee="other")
    item("user", "Bob writes in French", user="bob")
    text = block(request(memory=ON))
    assert text == (
        "<agent_memory_context>\n- [agent_user] Alice's repo is lw-core\n</agent_memory_context>"
    )
    [use] = MemoryUse.objects.filter(kind="injected")
    assert (use.item_id, use.run_id, use.invocation, use.chat, use.actor) == (
        mine.id, RUN, "maker:0", False, "agent:helper",
    )  # fmt: skip


def test_the_registered_provider_adds_the_block_to_the_prompt_blocks() -> None:
    item("public", "The office is closed on Fridays")
    assert MEMORY_PROMPT in prompt_context._PROVIDERS
    blocks = asyncio.run(prompt_context.prompt_blocks(request(memory=ON)))
    assert "- [public] The office is closed on Fridays" in "\n".join(blocks)


def test_a_chat_is_recorded_as_a_chat_without_a_run() -> None:
    item("user", "Alice prefers short answers", user="alice")
    chat = request(memory=ON, conversation=({"role": "user", "content": "hi"},))
    assert "Alice prefers short answers" in block(chat)
    use = MemoryUse.objects.get(kind="injected")
    assert (use.run_id, use.chat) == (None, True)


def test_the_budget_and_scopes_of_the_harness_apply() -> None:
    item("public", "p" * 100)
    item("user", "Alice prefers short answers", user="alice")
    only_public = block(request(memory={**ON, "scopes": ["public"]}))
    assert "[public]" in only_public and "Alice" not in only_public
    one = block(request(memory={**ON, "maxItems": 1}))
    assert one.count("\n- ") == 1 and "Alice prefers" in one  # the newest
    small = block(request(memory={**ON, "maxChars": 120}))
    assert len(small) <= 120 and "Alice prefers" in small and "ppp" not in small


@pytest.mark.parametrize(
    "memory",
    [
        None,  # no memory section (a snapshot from before memory): off
        {**ON, "enabled": False},
        {**ON, "maxItems": 0},
        {**ON, "maxChars": 0},
        {"enabled": True, "scopes": ["public"], "maxChars": 4000},  # no maxItems: old snapshot
    ],
)
def test_memory_off_gives_no_block_and_records_nothing(memory: dict[str, Any] | None) -> None:
    item("public", "The office is closed on Fridays")
    assert block(request(memory=memory)) == ""
    assert not MemoryUse.objects.filter(kind="injected").exists()


def test_without_a_person_only_public_items_are_given() -> None:
    item("user", "Alice prefers short answers", user="alice")
    assert block(request(user="", memory=ON)) == ""
    item("public", "Fridays off")
    assert "Fridays off" in block(request(user="", memory=ON))

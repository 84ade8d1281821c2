"""A chat at ``/v1/chat/completions`` is given the agent memory its caller may see: the
``<agent_memory_context>`` block (read with the request's preparation) reaches the model in the
system prompt, and the injection is recorded as a chat's use. The real app under uvicorn, the
official SDK, a model over loopback HTTP."""

from __future__ import annotations

import openai
import pytest

from memory.models import MemoryUse
from memory.services import memory_create
from tests.gateway.conftest import Team
from tests.support.model_server import Completion
from tests.support.workers import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_a_chat_gets_the_memory_of_its_caller_and_records_the_injection(
    server: str, team: Team
) -> None:
    ada = team.employee("ada")
    key = team.caller("alice", ada)
    mine = memory_create(
        scope="agent_user", username="alice", employee="ada", content="Alice likes tea.",
        created_by="alice",
    )  # fmt: skip
    memory_create(scope="user", username="bob", content="Bob likes coffee.", created_by="bob")
    team.model.queue(Completion(content="Tea it is."))
    with openai.OpenAI(base_url=f"{server}/v1", api_key=key, max_retries=0, timeout=30) as sdk:
        reply = sdk.chat.completions.create(
            model="ada", messages=[{"role": "user", "content": "What do I like?"}]
        )
    assert reply.choices[0].message.content == "Tea it is."
    system = team.model.bodies[0]["messages"][0]["content"]
    assert (
        "<agent_memory_context>\n- [agent_user] Alice likes tea.\n</agent_memory_context>" in system
    )
    assert "Bob likes coffee." not in system  # another person's memory
    wait_for(lambda: MemoryUse.objects.filter(item=mine, kind="injected").exists(), timeout=10)
    use = MemoryUse.objects.get(item=mine, kind="injected")
    assert use.chat and use.run_id is None and use.actor == "agent:ada"

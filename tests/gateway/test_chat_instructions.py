"""A chat at ``/v1/chat/completions`` renders its employee's prompt with the latest published
instruction versions (a chat pins nothing): publishing v2 changes the next chat's prompt. The
real app under uvicorn, the official SDK, a model over loopback HTTP."""

from __future__ import annotations

import openai
import pytest

from instructions.services import instruction_create, instruction_publish, instruction_save_draft
from tests.gateway.conftest import Team
from tests.support.model_server import Completion

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_a_chat_renders_the_latest_published_instruction(server: str, team: Team) -> None:
    instruction_create(name="tone", text="Answer in plain words.", created_by="tester")
    instruction_publish(name="tone", published_by="tester")
    ada = team.employee("ada", system_prompt="Tone: ${instructions.tone}")
    key = team.caller("alice", ada)
    with openai.OpenAI(base_url=f"{server}/v1", api_key=key, max_retries=0, timeout=30) as sdk:
        for _ in range(2):
            team.model.queue(Completion(content="ok"))
            sdk.chat.completions.create(model="ada", messages=[{"role": "user", "content": "hi"}])
            instruction_save_draft(name="tone", text="Answer in haiku.", created_by="tester")
            instruction_publish(name="tone", published_by="tester")
    first, second = (body["messages"][0]["content"] for body in team.model.bodies)
    assert first.startswith("Tone: Answer in plain words.\n")
    assert second.startswith("Tone: Answer in haiku.\n")

"""The offline scripted model provider and its built-in demo script."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runtime.scripted import (
    SCRIPTED_MODEL,
    Script,
    ScriptedModelClient,
    load_script,
)
from runtime.types import ChatRequest, ChatResponse, Message

pytestmark = pytest.mark.anyio

GOAL = "Add a changelog note to `docs/notes.md` about the new release."
TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("read", "write")
]


def conversation(role: str, *extra: Message) -> list[Message]:
    return [
        {"role": "system", "content": f"You are the {role}. role:{role}"},
        {"role": "user", "content": GOAL},
        *extra,
    ]


def after_call(response: ChatResponse, result: str) -> list[Message]:
    call = response.tool_calls[0]
    assistant = {
        "role": "assistant",
        "content": response.content,
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
        ],
    }
    return [assistant, {"role": "tool", "tool_call_id": call.id, "content": result}]


@pytest.fixture
def demo() -> ScriptedModelClient:
    return ScriptedModelClient(load_script("demo"), endpoint="offline")


async def test_the_leader_returns_a_json_plan(demo: ScriptedModelClient):
    response = await demo.complete(ChatRequest(messages=conversation("leader")))

    plan = json.loads(response.content)
    assert plan["tasks"][0]["title"] == "Update docs/notes.md"
    assert GOAL in plan["tasks"][0]["detail"]
    assert response.tool_calls == []


async def test_the_maker_reads_then_writes_an_edit_then_summarises(demo: ScriptedModelClient):
    messages = conversation("maker")

    read = await demo.complete(ChatRequest(messages=messages, tools=TOOLS))
    messages += after_call(read, "# Notes\nold line")
    write = await demo.complete(ChatRequest(messages=messages, tools=TOOLS))
    messages += after_call(write, "wrote 2 lines")
    summary = await demo.complete(ChatRequest(messages=messages, tools=TOOLS))

    assert (read.tool_calls[0].name, json.loads(read.tool_calls[0].arguments)) == (
        "read",
        {"path": "docs/notes.md"},
    )
    written = json.loads(write.tool_calls[0].arguments)
    assert write.tool_calls[0].name == "write"
    assert written["path"] == "docs/notes.md"
    assert written["content"].startswith("# Notes\nold line\n")
    assert written["content"] != "# Notes\nold line"
    assert summary.tool_calls == []
    assert "docs/notes.md" in summary.content
    assert summary.finish_reason == "stop"


async def test_the_maker_answers_in_text_when_tools_are_withdrawn(demo: ScriptedModelClient):
    messages = conversation("maker")
    read = await demo.complete(ChatRequest(messages=messages, tools=TOOLS))
    messages += after_call(read, "content")

    final = await demo.complete(ChatRequest(messages=messages))  # the loop's last step

    assert final.tool_calls == []
    assert final.content


async def test_the_verifier_returns_a_passing_verdict(demo: ScriptedModelClient):
    response = await demo.complete(ChatRequest(messages=conversation("verifier")))

    verdict = json.loads(response.content)
    assert verdict["verdict"] == "pass"
    assert verdict["reasons"]
    assert verdict["checks"] == [{"name": "diff-present", "passed": True, "evidence": []}]


async def test_every_response_says_it_is_scripted(demo: ScriptedModelClient):
    response = await demo.complete(ChatRequest(messages=[{"role": "user", "content": "hello"}]))

    assert response.model.startswith(SCRIPTED_MODEL)
    assert "scripted" in response.model
    assert "scripted model" in response.content  # the fallback says so in words, too
    assert response.endpoint == "offline"
    assert response.cost == 0


async def test_the_same_conversation_gets_the_same_answer(demo: ScriptedModelClient):
    request = ChatRequest(messages=conversation("maker"), tools=TOOLS)

    first, second = await demo.complete(request), await demo.complete(request)

    assert first == second
    assert first.usage.prompt_tokens > 0


async def test_goal_text_with_quotes_still_yields_valid_json(demo: ScriptedModelClient):
    messages = [
        {"role": "system", "content": "role:leader"},
        {"role": "user", "content": 'Fix "quoted" things in `a.py`\n and {braces} ${goal}'},
    ]

    plan = json.loads((await demo.complete(ChatRequest(messages=messages))).content)

    assert plan["tasks"][0]["title"] == "Update a.py"


async def test_streamed_text_goes_to_on_text(demo: ScriptedModelClient):
    seen: list[str] = []
    request = ChatRequest(messages=conversation("verifier"), stream=True)

    response = await demo.complete(request, on_text=seen.append)

    assert seen == [response.content]


async def test_a_script_can_come_from_a_json_file(tmp_path: Path):
    script: dict[str, Any] = {
        "name": "custom",
        "rules": [
            {
                "name": "greet",
                "when": {"last_user_matches": r"^hi\b"},
                "reply": {"text": "hello, ${last_user}"},
            }
        ],
        "fallback": {"text": "?"},
    }
    path = tmp_path / "custom.json"
    path.write_text(json.dumps(script))
    model = ScriptedModelClient(load_script(str(path)))

    response = await model.complete(ChatRequest(messages=[{"role": "user", "content": "hi you"}]))

    assert response.content == "hello, hi you"
    assert "custom" in response.model


def test_unknown_scripts_and_empty_replies_are_refused():
    with pytest.raises(ValueError, match="unknown script"):
        load_script("nope")
    with pytest.raises(ValueError, match="needs text, json or tool_calls"):
        Script.model_validate({"name": "x", "rules": [], "fallback": {}})

"""The official ``openai`` SDK, unchanged, against ``/v1`` of the real ASGI app under uvicorn:
it lists the granted employees, gets a completion with usage, streams one to a clean
``finish_reason: "stop"``, gets its typed exceptions for a bad key, an unknown employee and a
missing grant, and an employee's server-side tool runs in both modes, the stream carrying its
``agent_metadata``. Each request leaves one record (no message contents)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import openai
import pytest

from gateway import runner
from gateway.models import ChatCompletionRecord
from orchestrator.accounts.roles import Role
from orchestrator.agents.clients import breaker_default
from runtime.tools import ToolContext, ToolResult
from runtime.types import Effect, ToolSpec
from tests.gateway.conftest import Team, WeatherTool
from tests.support.model_server import (
    Completion,
    Error,
    RawEvent,
    RecordedRequest,
    Stream,
    as_requested,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
SDK = Callable[[str], openai.OpenAI]


@pytest.fixture
def sdk(server: str) -> Iterator[Callable[[str], openai.OpenAI]]:
    """``sdk(key)``: the official client on ``/v1`` with that API key (closed at the end)."""
    made: list[openai.OpenAI] = []

    def make(key: str) -> openai.OpenAI:
        made.append(openai.OpenAI(base_url=f"{server}/v1", api_key=key, max_retries=0, timeout=30))
        return made[-1]

    yield make
    for client in made:
        client.close()


def records(expected: int, timeout: float = 5.0) -> list[ChatCompletionRecord]:
    """The records once ``expected`` were written (they are written after the answer)."""
    deadline = time.monotonic() + timeout
    while True:
        found = list(ChatCompletionRecord.objects.order_by("created_at"))
        if len(found) >= expected or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def stream_events(server: str, key: str, body: dict[str, Any]) -> list[str]:
    """POST a streamed chat over plain HTTP (status 200 asserted): its ``data:`` payloads."""
    with httpx2.Client(timeout=30) as http:
        response = http.post(
            f"{server}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        )
    assert response.status_code == 200, response.text
    return [line.removeprefix("data: ") for line in response.text.splitlines() if line]


def weather_script(request: RecordedRequest) -> Completion:
    """Call ``weather`` once, then answer with what it said."""
    messages = request.body["messages"]
    results = [m for m in messages if m.get("role") == "tool"]
    if not results:
        return Completion(tool_calls=[("weather", json.dumps({"city": "Oslo"}))], usage=(20, 4))
    return Completion(content=f"Report: {results[-1]['content']}", usage=(30, 6))


def test_models_list_shows_exactly_the_granted_employees(sdk: SDK, team: Team) -> None:
    ada, bob = team.employee("ada"), team.employee("bob")
    team.employee("cyd")
    key = team.caller("alice", ada, bob)
    assert sorted(m.id for m in sdk(key).models.list()) == ["ada", "bob"]
    assert sdk(key).models.retrieve("ada").owned_by == "loopwright"
    # An admin may call every employee without grants; a user without grants none.
    admin = team.caller("root", roles=(Role.ADMIN,))
    assert sorted(m.id for m in sdk(admin).models.list()) == ["ada", "bob", "cyd"]
    assert [m.id for m in sdk(team.caller("nobody")).models.list()] == []


def test_a_completion_has_text_and_usage(sdk: SDK, team: Team) -> None:
    key = team.caller("alice", team.employee("ada"))
    team.model.queue(Completion(content="Hello from Ada.", usage=(12, 4)))
    reply = sdk(key).chat.completions.create(
        model="ada", messages=[{"role": "user", "content": "hi"}], temperature=0.2, max_tokens=64
    )
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert reply.model == "ada"
    assert reply.choices[0].message.content == "Hello from Ada."
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (12, 4)
    sent = team.model.bodies[0]
    assert sent["temperature"] == 0.2
    assert sent["messages"][0] == {"role": "system", "content": sent["messages"][0]["content"]}
    assert sent["messages"][0]["content"].startswith("You are ada.")
    (record,) = records(1)
    assert (record.id, record.employee_username, record.status) == (reply.id, "ada", "ok")
    assert (record.prompt_tokens, record.completion_tokens, record.stream) == (12, 4, False)
    assert record.user is not None and record.user.username == "alice"


def test_a_stream_ends_with_stop_and_usage(sdk: SDK, team: Team) -> None:
    key = team.caller("alice", team.employee("ada", streaming=True))
    team.model.always(as_requested(lambda _r: Completion(content="One two three.", usage=(9, 3))))
    chunks = list(
        sdk(key).chat.completions.create(
            model="ada",
            messages=[{"role": "user", "content": "count"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "One two three."
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (9, 3)
    assert {c.id for c in chunks} == {chunks[0].id}
    (record,) = records(1)
    assert (record.status, record.finish_reason, record.stream) == ("ok", "stop", True)


def test_typed_errors_for_a_bad_key_an_unknown_employee_and_no_grant(sdk: SDK, team: Team) -> None:
    ada = team.employee("ada")
    team.employee("bob")
    key = team.caller("alice", ada)
    ask = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.AuthenticationError) as bad_key:
        sdk("lw_nope_nope").chat.completions.create(model="ada", messages=ask)
    assert bad_key.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        sdk("not-a-token").models.list()
    with pytest.raises(openai.NotFoundError) as unknown:
        sdk(key).chat.completions.create(model="nobody", messages=ask)
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        sdk(key).models.retrieve("nobody")
    with pytest.raises(openai.PermissionDeniedError) as denied:
        sdk(key).chat.completions.create(model="bob", messages=ask)
    assert denied.value.code == "permission_denied"
    with pytest.raises(openai.BadRequestError) as bad:
        sdk(key).chat.completions.create(model="ada", messages=ask, temperature=3)
    assert bad.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as refused:
        sdk(key).chat.completions.create(model="ada", messages=ask, seed=7)
    assert (refused.value.param, refused.value.code) == ("seed", "unsupported_parameter")
    with pytest.raises(openai.BadRequestError) as role:
        sdk(key).chat.completions.create(model="ada", messages=[{"role": "robot", "content": "hi"}])
    assert role.value.param == "messages[0].role"
    assert team.model.requests == []  # nothing refused reached the model
    assert records(0) == []


def test_server_side_tools_run_in_both_modes(sdk: SDK, team: Team, weather: WeatherTool) -> None:
    key = team.caller("alice", team.employee("ada", tools=["weather"], streaming=True))
    team.model.always(as_requested(weather_script))
    ask = [{"role": "user", "content": "Weather in Oslo?"}]
    reply = sdk(key).chat.completions.create(model="ada", messages=ask)
    assert reply.choices[0].message.content == "Report: Oslo: sunny, 21 C"
    assert reply.usage is not None and reply.usage.prompt_tokens == 50
    extra: dict[str, Any] = reply.model_extra or {}
    assert [e["type"] for e in extra["agent_metadata"]] == ["tool_started", "tool_finished"]

    stream = sdk(key).chat.completions.create(model="ada", messages=ask, stream=True)
    chunks = list(stream)
    agent = [
        c.model_extra["agent_metadata"] for c in chunks if "agent_metadata" in (c.model_extra or {})
    ]
    started, finished = agent
    assert (started["type"], started["name"]) == ("tool_started", "weather")
    assert (finished["type"], finished["outcome"], finished["call_id"]) == (
        "tool_finished",
        "ok",
        started["call_id"],
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.endswith("Report: Oslo: sunny, 21 C")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert weather.calls == [{"city": "Oslo"}, {"city": "Oslo"}]
    assert [r.tool_calls for r in records(2)] == [1, 1]


def test_client_tools_come_back_as_tool_calls(sdk: SDK, team: Team) -> None:
    key = team.caller("alice", team.employee("ada"))
    team.model.queue(Completion(tool_calls=[("locate", "{}")], usage=(8, 2)))
    reply = sdk(key).chat.completions.create(
        model="ada",
        messages=[{"role": "user", "content": "Where am I?"}],
        tools=[{"type": "function", "function": {"name": "locate", "parameters": {}}}],
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    assert [c.function.name for c in choice.message.tool_calls] == ["locate"]


def test_a_failure_mid_stream_is_a_last_error_event_then_done(
    server: str, sdk: SDK, team: Team
) -> None:
    key = team.caller("alice", team.employee("ada", tools=["weather"], streaming=True))
    call = as_requested(
        lambda _r: Completion(tool_calls=[("weather", json.dumps({"city": "Oslo"}))])
    )
    fell_over = Error(400, {"error": {"message": "the model refused this"}})
    team.model.queue(call, fell_over, call).always(fell_over)
    body = {"model": "ada", "stream": True, "messages": [{"role": "user", "content": "go"}]}
    events = stream_events(server, key, body)
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert set(last) == {"error"} and set(last["error"]) == {"message", "type", "param", "code"}
    kinds = [json.loads(e).get("agent_metadata", {}).get("type") for e in events[:-2]]
    assert "tool_finished" in kinds  # the failure came after the tool ran
    (record,) = records(1)
    assert record.status == "error" and record.error
    # The official SDK raises at the error event.
    stream = sdk(key).chat.completions.create(model="ada", messages=body["messages"], stream=True)
    with pytest.raises(openai.APIError):
        list(stream)


def test_a_failure_after_the_model_accepted_the_stream_is_an_error_event(
    server: str, sdk: SDK, team: Team
) -> None:
    # The response starts once the model answered 200 with a stream; what fails after that,
    # even before any text, is the stream's last event (a refusal before it is an HTTP status).
    key = team.caller("alice", team.employee("brittle", streaming=True))
    # (a request error, code 400: a transient one would trip the endpoint's shared breaker)
    broken = RawEvent(json.dumps({"error": {"message": "it refused", "code": 400}}))
    team.model.always(Stream([broken]))
    body = {"model": "brittle", "stream": True, "messages": [{"role": "user", "content": "go"}]}
    events = stream_events(server, key, body)
    assert events[-1] == "[DONE]" and "it refused" in json.loads(events[-2])["error"]["message"]
    assert json.loads(events[0])["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    (record,) = records(1)
    assert record.status == "error" and "it refused" in record.error
    stream = sdk(key).chat.completions.create(
        model="brittle", messages=body["messages"], stream=True
    )
    with pytest.raises(openai.APIError, match="it refused"):
        list(stream)


def test_image_parts_reach_the_model_as_sent(sdk: SDK, team: Team) -> None:
    key = team.caller("alice", team.employee("ada"))
    team.model.queue(Completion(content="A red square."))
    parts = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
    ]  # fmt: skip
    reply = sdk(key).chat.completions.create(
        model="ada",
        messages=[{"role": "user", "content": parts}],  # type: ignore[list-item]
    )
    assert reply.choices[0].message.content == "A red square."
    sent = team.model.bodies[0]["messages"]
    assert sent[-1] == {"role": "user", "content": parts}


class NoteTool:
    """A server-side ``write`` tool that needs no working directory (it keeps its notes)."""

    spec = ToolSpec(
        "post_note",
        "Post a note.",
        {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        Effect.WRITE,
    )

    def __init__(self) -> None:
        self.posted: list[str] = []

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        self.posted.append(arguments["text"])
        return ToolResult("posted")


def test_a_tool_the_harness_gates_is_refused_and_the_model_reads_why(
    sdk: SDK, team: Team, weather: WeatherTool
) -> None:
    """The seeded ``default`` profile makes every write wait for a human: a request cannot ask
    one, so the call is refused (nothing runs) and the model reads the refusal."""
    note = NoteTool()
    runner._registry().register(note)  # the server's registry (the weather fixture's)
    key = team.caller("alice", team.employee("ada", tools=["post_note"]))

    def script(request: RecordedRequest) -> Completion:
        results = [m for m in request.body["messages"] if m.get("role") == "tool"]
        if not results:
            return Completion(tool_calls=[("post_note", json.dumps({"text": "hi"}))])
        return Completion(content=f"Could not post: {results[-1]['content']}")

    team.model.always(script)
    reply = sdk(key).chat.completions.create(
        model="ada", messages=[{"role": "user", "content": "Post a note."}]
    )
    events = (reply.model_extra or {})["agent_metadata"]
    finished = [e for e in events if e["type"] == "tool_finished"]
    assert [(e["name"], e["outcome"]) for e in finished] == [("post_note", "refused")]
    assert "needs a human approval" in (reply.choices[0].message.content or "")
    assert note.posted == []


def test_a_rate_limited_model_is_a_rate_limit_error_with_its_retry_after(
    sdk: SDK, team: Team
) -> None:
    # An employee of its own: the endpoint breaker it trips is shared (Redis) and outlives the test.
    limited = team.employee("limited")
    key = team.caller("alice", limited)
    team.model.always(Error(429, {"error": {"message": "slow down"}}, {"Retry-After": "7"}))
    ask = [{"role": "user", "content": "hi"}]
    try:
        with pytest.raises(openai.RateLimitError) as caught:
            sdk(key).chat.completions.create(model="limited", messages=ask, stream=True)
        assert caught.value.code == "rate_limit_exceeded"
        # The provider's hint, or the endpoint breaker's next probe when that is later.
        assert int(caught.value.response.headers["Retry-After"]) >= 7
        # Meanwhile the breaker refuses without asking the model: unavailable, not rate limited.
        with pytest.raises(openai.InternalServerError) as refused:
            sdk(key).chat.completions.create(model="limited", messages=ask)
        assert (refused.value.status_code, refused.value.code) == (503, "model_unavailable")
        assert len(team.model.requests) == 1
    finally:
        breaker_default().store.clear("model-endpoint:limited-loopback")


def test_tools_that_need_a_working_directory_are_not_offered_in_a_request(
    sdk: SDK, team: Team, weather: WeatherTool
) -> None:
    ada = team.employee("ada", tools=["read", "list", "weather"])
    key = team.caller("alice", ada)
    team.model.queue(Completion(content="ok"))
    sdk(key).chat.completions.create(model="ada", messages=[{"role": "user", "content": "hi"}])
    offered = [t["function"]["name"] for t in team.model.requests[0].body.get("tools", [])]
    assert "weather" in offered
    assert "read" not in offered and "list" not in offered

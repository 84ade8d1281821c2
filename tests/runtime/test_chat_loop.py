"""The request-scoped loop (runtime.chat) against the loopback model server: answers with usage,
server tools with their agent events, gated tools refused, client tools handed back and
continued, the client's parameters on the wire, partial and clean failures."""

from __future__ import annotations

import json

import pytest

from runtime.chat import ChatFailed, ChatTurn, chat_complete
from runtime.dispatch import split_client_calls
from runtime.types import Effect, ToolCall
from tests.runtime.chat_helpers import (
    EMPLOYEE_PROMPT,
    Recorder,
    WeatherTool,
    client_tool,
    make_invoker,
    user,
)
from tests.support.model_server import Completion, Error, ModelServer

pytestmark = pytest.mark.anyio

HARNESS = {"settings": {}, "provenance": {}}


async def test_a_plain_answer_comes_back_with_its_usage(model_server: ModelServer):
    model_server.queue(Completion(content="Hello there.", usage=(21, 4)))
    history = (
        {"role": "system", "content": "Answer briefly."},
        user("Hi"),
        {"role": "assistant", "content": "Hello! How can I help?"},
        user("Say hello again."),
    )

    result = await chat_complete(
        make_invoker(model_server, []), employee="ada", harness=HARNESS, turn=ChatTurn(history)
    )

    assert (result.content, result.finish_reason, result.error) == ("Hello there.", "stop", "")
    assert (result.prompt_tokens, result.completion_tokens, result.model_steps) == (21, 4, 1)
    assert result.tool_calls == ()
    [body] = model_server.bodies
    # The employee's prompt first, then the client's conversation exactly as sent.
    system, *rest = body["messages"]
    assert system["role"] == "system" and system["content"] == EMPLOYEE_PROMPT
    assert rest == list(history)
    assert "tools" not in body and "stream" not in body


async def test_image_parts_reach_the_endpoint_unchanged(model_server: ModelServer):
    model_server.queue(Completion(content="A red square."))
    image = {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        ],
    }

    await chat_complete(
        make_invoker(model_server, []), employee="ada", harness=HARNESS, turn=ChatTurn((image,))
    )

    assert model_server.bodies[0]["messages"][1] == image


async def test_a_server_tool_runs_and_its_progress_is_reported_in_order(
    model_server: ModelServer,
):
    lookup = WeatherTool()
    model_server.queue(
        Completion(tool_calls=[("lookup", '{"city": "Paris"}')], usage=(30, 8)),
        Completion(content="Sunny in Paris.", usage=(50, 6)),
    )
    sink = Recorder()

    result = await chat_complete(
        make_invoker(model_server, [lookup]),
        employee="ada",
        harness=HARNESS,
        turn=ChatTurn((user("Weather in Paris?"),)),
        sink=sink,
    )

    assert result.content == "Sunny in Paris."
    assert (result.prompt_tokens, result.completion_tokens, result.model_steps) == (80, 14, 2)
    assert lookup.finished == [{"city": "Paris"}]
    started, finished = sink.agent()
    assert started == {"type": "tool_started", "call_id": "call_0", "name": "lookup"}
    assert finished["type"] == "tool_finished" and finished["outcome"] == "ok"
    assert (finished["call_id"], finished["name"]) == ("call_0", "lookup")
    assert isinstance(finished["duration_ms"], int)
    # Not streamed: the sink gets the agent's progress only, and the model answers in one piece.
    assert sink.kinds() == ["tool_started", "tool_finished"]
    assert all("stream" not in body for body in model_server.bodies)
    # The model read the tool's result in its second step.
    tool_message = model_server.bodies[1]["messages"][-1]
    assert tool_message == {
        "role": "tool",
        "tool_call_id": "call_0",
        "content": "Paris: sunny, 21 C",
    }
    assert [t["function"]["name"] for t in model_server.bodies[0]["tools"]] == ["lookup"]


async def test_a_gated_tool_is_refused_and_the_model_reads_why(model_server: ModelServer):
    deploy = WeatherTool("deploy", Effect.EXTERNAL)
    model_server.queue(
        Completion(tool_calls=[("deploy", '{"city": "Paris"}')]),
        Completion(content="I could not deploy: it needs an approval."),
    )
    sink = Recorder()

    result = await chat_complete(
        make_invoker(model_server, [deploy], {"deploy": ("ask", "deploys need a human")}),
        employee="ada",
        harness=HARNESS,
        turn=ChatTurn((user("Deploy Paris."),)),
        sink=sink,
    )

    assert deploy.calls == []  # never run
    assert result.content == "I could not deploy: it needs an approval."
    refusal = model_server.bodies[1]["messages"][-1]
    assert refusal["role"] == "tool" and refusal["tool_call_id"] == "call_0"
    assert refusal["content"].startswith("Error: tool 'deploy' needs a human approval")
    assert "this endpoint cannot ask for; not run" in refusal["content"]
    assert "deploys need a human" in refusal["content"]
    assert [(e["type"], e.get("outcome")) for e in sink.agent()] == [
        ("tool_started", None),
        ("tool_finished", "refused"),
    ]


async def test_a_client_tool_call_is_handed_back_and_the_next_request_continues(
    model_server: ModelServer,
):
    lookup = WeatherTool()
    invoker = make_invoker(model_server, [lookup])
    locate = {
        "id": "call_loc",
        "type": "function",
        "function": {"name": "get_location", "arguments": "{}"},
    }
    # One step calls a server tool and a client tool: the server's runs first.
    model_server.queue(
        Completion(
            content="Checking.",
            tool_calls=[("lookup", '{"city": "Oslo"}'), locate],
            usage=(40, 9),
        )
    )
    question = user("Weather here?")
    turn = ChatTurn((question,), client_tools=(client_tool("get_location"),))

    first = await chat_complete(invoker, employee="ada", harness=HARNESS, turn=turn)

    assert lookup.finished == [{"city": "Oslo"}]
    assert first.finish_reason == "tool_calls"
    assert first.tool_calls == (locate,)
    assert (first.content, first.prompt_tokens, first.model_steps) == ("Checking.", 40, 1)
    offered = [t["function"]["name"] for t in model_server.bodies[0]["tools"]]
    assert offered == ["lookup", "get_location"]

    # The client ran it and sends the call and its result back as history.
    model_server.queue(Completion(content="You are in Bergen; it is sunny."))
    assistant = {
        "role": "assistant",
        "content": first.content,
        "tool_calls": list(first.tool_calls),
    }
    result_message = {"role": "tool", "tool_call_id": "call_loc", "content": "Bergen"}
    follow_up = ChatTurn(
        (question, assistant, result_message), client_tools=(client_tool("get_location"),)
    )

    second = await chat_complete(invoker, employee="ada", harness=HARNESS, turn=follow_up)

    assert (second.content, second.finish_reason) == ("You are in Bergen; it is sunny.", "stop")
    assert model_server.bodies[1]["messages"][1:] == [question, assistant, result_message]


async def test_a_client_tool_named_like_a_server_tool_is_refused(model_server: ModelServer):
    turn = ChatTurn((user("hi"),), client_tools=(client_tool("lookup"),))

    with pytest.raises(ChatFailed) as failed:
        await chat_complete(
            make_invoker(model_server, [WeatherTool()]), employee="ada", harness=HARNESS, turn=turn
        )

    assert (failed.value.code, failed.value.status) == ("tool_name_conflict", 400)
    assert model_server.requests == []


async def test_the_clients_parameters_reach_the_request_body(model_server: ModelServer):
    schema = {"name": "weather", "schema": {"type": "object"}, "strict": True}
    model_server.queue(
        Completion(tool_calls=[("lookup", '{"city": "Rome"}')]),
        Completion(content='{"city": "Rome"}'),
    )
    invoker = make_invoker(model_server, [WeatherTool()], params={"temperature": 0.1})
    turn = ChatTurn(
        (user("Rome?"),),
        temperature=0.7,
        max_tokens=300,
        response_format={"type": "json_schema", "json_schema": schema},
        tool_choice="required",
    )

    result = await chat_complete(invoker, employee="ada", harness=HARNESS, turn=turn)

    assert json.loads(result.content) == {"city": "Rome"}
    first, second = model_server.bodies
    for body in (first, second):
        assert body["temperature"] == 0.7  # the client's, over the employee's 0.1
        assert body["max_completion_tokens"] == 300
        assert body["response_format"] == {"type": "json_schema", "json_schema": schema}
    # A required tool holds for the first step only, or the model could never answer.
    assert first["tool_choice"] == "required"
    assert "tool_choice" not in second


async def test_tool_choice_none_holds_for_every_step(model_server: ModelServer):
    model_server.queue(Completion(content="No tools needed."))
    turn = ChatTurn((user("hi"),), tool_choice="none", response_format={"type": "json_object"})

    await chat_complete(
        make_invoker(model_server, [WeatherTool()]), employee="ada", harness=HARNESS, turn=turn
    )

    [body] = model_server.bodies
    assert body["tool_choice"] == "none"
    assert body["response_format"] == {"type": "json_object"}


async def test_a_failure_after_text_returns_that_text_with_the_error(model_server: ModelServer):
    model_server.queue(
        Completion(content="Let me check Paris.", tool_calls=[("lookup", '{"city": "Paris"}')]),
        Error(400, {"error": {"message": "bad request", "type": "invalid_request_error"}}),
    )

    result = await chat_complete(
        make_invoker(model_server, [WeatherTool()]),
        employee="ada",
        harness=HARNESS,
        turn=ChatTurn((user("Paris?"),)),
    )

    assert result.content == "Let me check Paris."
    assert result.error.startswith("model_error: ")
    assert (result.finish_reason, result.model_steps) == ("stop", 1)


async def test_an_unavailable_model_before_any_text_is_a_clean_503(model_server: ModelServer):
    model_server.queue(Error(503, {"error": {"message": "overloaded"}}))

    with pytest.raises(ChatFailed) as failed:
        await chat_complete(
            make_invoker(model_server, []),
            employee="ada",
            harness=HARNESS,
            turn=ChatTurn((user("hi"),)),
        )

    assert (failed.value.code, failed.value.status) == ("model_unavailable", 503)


async def test_a_harness_that_allows_no_model_step_is_refused(model_server: ModelServer):
    harness = {"settings": {"limits": {"recursionLimit": 0}}, "provenance": {}}

    with pytest.raises(ChatFailed) as failed:
        await chat_complete(
            make_invoker(model_server, []),
            employee="ada",
            harness=harness,
            turn=ChatTurn((user("hi"),)),
        )

    assert (failed.value.code, failed.value.status) == ("harness_limit", 400)
    assert model_server.requests == []


async def test_skipped_and_invalid_calls_are_reported_with_a_warning(model_server: ModelServer):
    lookup = WeatherTool()
    same = ("lookup", '{"city": "Paris"}')
    model_server.queue(
        Completion(tool_calls=[same]),
        Completion(tool_calls=[same]),
        Completion(tool_calls=[same, ("teleport", "{}")]),
        Completion(content="Sunny."),
    )
    sink = Recorder()

    result = await chat_complete(
        make_invoker(model_server, [lookup]),
        employee="ada",
        harness=HARNESS,
        turn=ChatTurn((user("Paris?"),)),
        sink=sink,
    )

    assert result.content == "Sunny." and len(lookup.finished) == 2
    finished = [(e["name"], e["outcome"]) for e in sink.agent() if e["type"] == "tool_finished"]
    assert finished == [
        ("lookup", "ok"),
        ("lookup", "ok"),
        ("lookup", "refused"),  # the third identical call is not run
        ("teleport", "error"),  # no such tool
    ]
    [warning] = [e for e in sink.agent() if e["type"] == "warning"]
    assert warning["event"] == "tool.duplicate"
    assert "'lookup'" in warning["message"]


async def test_an_answer_cut_before_any_text_ends_with_length(model_server: ModelServer):
    model_server.queue(Completion(content="", reasoning="Thinking...", finish_reason="length"))

    result = await chat_complete(
        make_invoker(model_server, []),
        employee="ada",
        harness=HARNESS,
        turn=ChatTurn((user("hi"),), max_tokens=5),
    )

    assert (result.content, result.finish_reason, result.error) == ("", "length", "")
    assert result.reasoning_content == "Thinking..."


def test_calls_split_between_server_and_client_tools_by_name() -> None:
    calls = [
        ToolCall("a", "lookup", "{}"),
        ToolCall("b", "functions.get_location", "{}"),  # loosely the client's tool
        ToolCall("c", "Lookup", "{}"),  # loosely the server's: stays with the server
        ToolCall("d", "teleport", "{}"),  # nobody's: the server's planner answers it
    ]

    server, client = split_client_calls(calls, ["get_location", "lookup_x"], ["lookup"])

    assert [c.id for c in server] == ["a", "c", "d"]
    assert client == [ToolCall("b", "get_location", "{}")]
    assert split_client_calls(calls, [], ["lookup"]) == (calls, [])

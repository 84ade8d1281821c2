"""Streamed chat answers (runtime.chat with a sink) against the loopback model server: content
and reasoning deltas as they arrive, preambles withheld, and cancellation (a client that
disconnects) stopping the model call and the tools at once."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from runtime.chat import ChatResult, ChatTurn, chat_complete
from tests.runtime.chat_helpers import Recorder, WeatherTool, make_invoker, user
from tests.support.model_server import (
    Completion,
    Delay,
    ModelServer,
    Pause,
    Reasoning,
    RecordedRequest,
    Stream,
    Text,
    streamed,
)

pytestmark = pytest.mark.anyio

HARNESS = {"settings": {}, "provenance": {}}


async def test_deltas_reach_the_sink_as_they_arrive_and_only_the_answer_is_content(
    model_server: ModelServer,
):
    lookup = WeatherTool()
    model_server.queue(
        # A short preamble before a tool call is withheld (docs/model-client.md "auto").
        streamed(
            Completion(
                content="Let me look.",
                reasoning="Need the weather.",
                tool_calls=[("lookup", '{"city": "Paris"}')],
                usage=(30, 7),
            )
        ),
        Stream(
            [Reasoning("Got it. "), Text("Sunny "), Pause(0.2), Text("in Paris.")],
            usage=(60, 5),
        ),
    )
    sink = Recorder()

    result = await chat_complete(
        make_invoker(model_server, [lookup]),
        employee="ada",
        harness=HARNESS,
        turn=ChatTurn((user("Paris?"),), stream=True),
        sink=sink,
    )

    assert all(body["stream"] is True for body in model_server.bodies)
    assert sink.text("content") == "Sunny in Paris."
    assert sink.text("reasoning") == "Need the weather.Got it. "
    assert sink.kinds()[:3] == ["reasoning", "tool_started", "tool_finished"]
    assert result.content == "Sunny in Paris."
    assert result.reasoning_content == "Need the weather.\n\nGot it. "
    assert (result.prompt_tokens, result.completion_tokens) == (90, 12)


async def test_an_answer_without_tools_streams_in_real_time(model_server: ModelServer):
    model_server.queue(Stream([Text("One"), Pause(0.3), Text(" two")]))
    sink = Recorder()
    started = time.monotonic()

    result = await chat_complete(
        make_invoker(model_server, []),
        employee="ada",
        harness=HARNESS,
        turn=ChatTurn((user("Count."),), stream=True),
        sink=sink,
    )

    contents = [(at, event.text) for at, event in sink.events if event.kind == "content"]
    assert [text for _, text in contents] == ["One", " two"]
    assert contents[0][0] - started < 0.25  # before the pause, not at the end
    assert result.content == "One two"


async def cancelled_within_a_second(task: asyncio.Task[ChatResult]) -> float:
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return time.monotonic() - started


async def test_cancelling_a_streamed_answer_closes_the_model_connection_at_once(
    model_server: ModelServer,
):
    handlers: list[threading.Thread] = []

    def slow_answer(request: RecordedRequest) -> Stream:
        handlers.append(threading.current_thread())
        # A minute of dots: the server notices a closed connection at its next write.
        return Stream(
            [Text("Once"), *[event for _ in range(1200) for event in (Pause(0.05), Text("."))]]
        )

    model_server.queue(slow_answer)
    sink = Recorder()
    task = asyncio.ensure_future(
        chat_complete(
            make_invoker(model_server, []),
            employee="ada",
            harness=HARNESS,
            turn=ChatTurn((user("Tell a long story."),), stream=True),
            sink=sink,
        )
    )
    await asyncio.wait_for(sink.first.wait(), timeout=5)

    assert await cancelled_within_a_second(task) < 1.0
    [handler] = handlers
    # The server's handler saw the connection closed and stopped writing.
    await asyncio.to_thread(handler.join, 1.0)
    assert not handler.is_alive()


async def test_cancelling_stops_a_running_tool_at_once(model_server: ModelServer):
    slow = WeatherTool(sleep=30)
    model_server.queue(Completion(tool_calls=[("lookup", '{"city": "Lima"}')]))
    task = asyncio.ensure_future(
        chat_complete(
            make_invoker(model_server, [slow]),
            employee="ada",
            harness=HARNESS,
            turn=ChatTurn((user("Lima?"),)),
        )
    )
    await asyncio.wait_for(slow.started.wait(), timeout=5)

    assert await cancelled_within_a_second(task) < 1.0
    assert slow.cancelled and slow.finished == []


async def test_cancelling_a_non_streamed_model_call_returns_at_once(model_server: ModelServer):
    model_server.queue(Delay(30, Completion(content="too late")))
    task = asyncio.ensure_future(
        chat_complete(
            make_invoker(model_server, []),
            employee="ada",
            harness=HARNESS,
            turn=ChatTurn((user("hi"),)),
        )
    )
    deadline = time.monotonic() + 5
    while not model_server.requests and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert model_server.requests, "the model was never asked"

    assert await cancelled_within_a_second(task) < 1.0

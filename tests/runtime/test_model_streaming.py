"""Streaming against the loopback server: assembly, live text and tool-call detection modes."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from runtime.model_client import OpenAICompatibleClient
from runtime.model_config import EndpointConfig, RetryPolicy
from runtime.streaming import StreamMode
from runtime.types import ChatRequest, ContextOverflow, ModelCallFailed
from tests.support.model_server import (
    Completion,
    Error,
    ModelServer,
    Pause,
    RawEvent,
    Reasoning,
    Stream,
    Text,
    ToolCallArgs,
    ToolCallStart,
    context_overflow_error,
    split_tool_call,
)

pytestmark = pytest.mark.anyio

TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("read", "write")
]
WITH_TOOLS = ChatRequest(messages=[{"role": "user", "content": "fix it"}], tools=TOOLS, stream=True)
NO_TOOLS = ChatRequest(messages=[{"role": "user", "content": "chat"}], stream=True)
GLM_TOOL_CALL = split_tool_call(0, "read", '{"path": "docs/notes.md"}', pieces=5)


class LiveText:
    """An on_text sink that remembers what arrived and when."""

    def __init__(self) -> None:
        self.parts: list[tuple[float, str]] = []

    def __call__(self, delta: str) -> None:
        self.parts.append((time.monotonic(), delta))

    @property
    def text(self) -> list[str]:
        return [part for _, part in self.parts]


def streaming_client(
    server: ModelServer, mode: StreamMode = "auto", window: float = 0.5, **fields: Any
) -> tuple[OpenAICompatibleClient, LiveText]:
    live = LiveText()
    config = EndpointConfig(name="primary", base_url=server.url, model="test-model", **fields)
    model = OpenAICompatibleClient(
        config,
        stream_mode=mode,
        auto_window_seconds=window,
        on_text=live,
        retry=RetryPolicy(base_delay=0.01, max_delay=0.02),
    )
    return model, live


async def test_text_deltas_stream_live_and_assemble_with_usage(model_server: ModelServer):
    model_server.queue(Stream([Text("Hel"), Text("lo"), Text(" world")], usage=(42, 3)))
    model, live = streaming_client(model_server)

    response = await model.complete(NO_TOOLS)

    assert live.text == ["Hel", "lo", " world"]
    assert response.content == "Hello world"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (42, 3)
    assert response.finish_reason == "stop"
    body = model_server.bodies[0]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


async def test_tool_call_arguments_split_across_chunks_are_assembled_by_index(
    model_server: ModelServer,
):
    model_server.queue(
        Stream(
            [
                ToolCallStart(0, "read", id="call_a"),
                ToolCallStart(1, "write", id="call_b"),
                ToolCallArgs(0, '{"pa'),
                ToolCallArgs(1, '{"path": "b.txt", '),
                ToolCallArgs(0, 'th": "a.t'),
                ToolCallArgs(1, '"content": "x"}'),
                ToolCallArgs(0, 'xt"}'),
            ]
        )
    )
    model, live = streaming_client(model_server)

    response = await model.complete(WITH_TOOLS)

    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("call_a", "read", '{"path": "a.txt"}'),
        ("call_b", "write", '{"path": "b.txt", "content": "x"}'),
    ]
    assert response.finish_reason == "tool_calls"
    assert live.text == []


async def test_malformed_streamed_arguments_pass_through_unchanged(model_server: ModelServer):
    model_server.queue(Stream(split_tool_call(0, "read", '{"path": tru', pieces=2)))
    model, _ = streaming_client(model_server)

    response = await model.complete(WITH_TOOLS)

    assert response.tool_calls[0].arguments == '{"path": tru'


async def test_reasoning_content_is_collected_and_not_sent_as_text(model_server: ModelServer):
    model_server.queue(Stream([Reasoning("step 1. "), Reasoning("step 2."), Text("Answer")]))
    model, live = streaming_client(model_server)

    response = await model.complete(NO_TOOLS)

    assert response.reasoning_content == "step 1. step 2."
    assert live.text == ["Answer"]


async def test_auto_mode_catches_a_short_preamble_before_tool_calls(model_server: ModelServer):
    model_server.queue(Stream([Text("Let me check the file."), Pause(0.1), *GLM_TOOL_CALL]))
    model, live = streaming_client(model_server, window=0.5)

    response = await model.complete(WITH_TOOLS)

    assert live.text == []  # the preamble was held and never shown as an answer
    assert response.content == "Let me check the file."
    assert response.tool_calls[0].arguments == '{"path": "docs/notes.md"}'
    assert model.stream_mode == "auto"
    assert len(model_server.requests) == 1


async def test_auto_mode_releases_plain_text_when_the_window_passes(model_server: ModelServer):
    model_server.queue(Stream([Text("Part one. "), Pause(1.0), Text("Part two.")]))
    model, live = streaming_client(model_server, window=0.1)

    started = time.monotonic()
    response = await model.complete(WITH_TOOLS)

    assert live.text == ["Part one. ", "Part two."]
    # Released when the window expired, while the model was still silent.
    assert live.parts[0][0] - started < 0.7
    assert response.content == "Part one. Part two."
    assert response.tool_calls == []


async def test_a_long_preamble_self_heals_to_drain_and_reruns_the_round(
    model_server: ModelServer, caplog: pytest.LogCaptureFixture
):
    preamble = Stream(
        [Text("First I will explain my plan at length. "), Pause(0.6), *GLM_TOOL_CALL]
    )
    model_server.queue(preamble, preamble)
    model, live = streaming_client(model_server, window=0.1)

    with caplog.at_level(logging.WARNING, logger="runtime.model_client"):
        response = await model.complete(WITH_TOOLS)

    assert len(model_server.requests) == 2  # the round was re-run
    assert response.tool_calls[0].name == "read"
    assert model.stream_mode == "drain"  # and the instance stays in drain
    assert "routed as plain text" in caplog.text
    assert live.text == ["First I will explain my plan at length. "]  # only the misjudged part


async def test_after_self_healing_later_rounds_are_drained(model_server: ModelServer):
    preamble = Stream([Text("Long preamble. "), Pause(0.6), *GLM_TOOL_CALL])
    model_server.queue(preamble, preamble, Stream([Text("a"), Pause(0.2), Text("b")]))
    model, live = streaming_client(model_server, window=0.1)
    await model.complete(WITH_TOOLS)
    live.parts.clear()

    response = await model.complete(WITH_TOOLS)

    assert live.text == ["ab"]  # batched at the end: drain
    assert response.content == "ab"


async def test_first_content_mode_streams_the_first_text_at_once(model_server: ModelServer):
    model_server.queue(Stream([Text("x"), Pause(1.0), Text("y")]))
    model, live = streaming_client(model_server, mode="firstContent", window=5.0)

    started = time.monotonic()
    await model.complete(WITH_TOOLS)

    assert live.text == ["x", "y"]
    assert live.parts[0][0] - started < 0.7


async def test_the_upgrade_to_drain_overrides_first_content(model_server: ModelServer):
    stream = Stream([Text("Sure."), *GLM_TOOL_CALL])
    model_server.queue(stream, stream)
    model, _ = streaming_client(model_server, mode="firstContent")

    response = await model.complete(WITH_TOOLS)

    assert model.stream_mode == "drain"
    assert response.tool_calls[0].name == "read"
    assert len(model_server.requests) == 2


async def test_drain_mode_releases_text_only_after_the_whole_stream(model_server: ModelServer):
    model_server.queue(Stream([Text("a"), Pause(0.3), Text("b")]))
    model, live = streaming_client(model_server, mode="drain")

    started = time.monotonic()
    await model.complete(WITH_TOOLS)

    assert live.text == ["ab"]
    assert live.parts[0][0] - started >= 0.3


async def test_drain_mode_never_shows_a_preamble(model_server: ModelServer):
    model_server.queue(Stream([Text("Preamble "), Pause(0.2), *GLM_TOOL_CALL]))
    model, live = streaming_client(model_server, mode="drain")

    response = await model.complete(WITH_TOOLS)

    assert live.text == []
    assert response.tool_calls


async def test_without_tools_text_always_streams_in_real_time(model_server: ModelServer):
    model_server.queue(Stream([Text("x"), Pause(1.0), Text("y")]))
    model, live = streaming_client(model_server, mode="drain")

    started = time.monotonic()
    await model.complete(NO_TOOLS)

    assert live.parts[0][0] - started < 0.7


async def test_an_async_text_callback_is_awaited(model_server: ModelServer):
    model_server.queue(Stream([Text("a"), Text("b")]))
    model, _ = streaming_client(model_server)
    seen: list[str] = []

    async def sink(delta: str) -> None:
        seen.append(delta)

    await model.complete(NO_TOOLS, on_text=sink)

    assert seen == ["a", "b"]


async def test_an_error_before_the_stream_starts_is_retried(model_server: ModelServer):
    model_server.queue(Error(503), Stream([Text("ok")]))
    model, live = streaming_client(model_server)

    response = await model.complete(NO_TOOLS)

    assert response.content == "ok"
    assert live.text == ["ok"]


async def test_a_malformed_chunk_is_retried_when_nothing_was_shown(model_server: ModelServer):
    model_server.queue(Stream([RawEvent("{not json")]), Stream([Text("ok")]))
    model, _ = streaming_client(model_server)

    response = await model.complete(NO_TOOLS)

    assert response.content == "ok"
    assert len(model_server.requests) == 2


async def test_a_stream_that_breaks_after_text_was_shown_is_not_resent(model_server: ModelServer):
    model_server.queue(Stream([Text("partial answer")], complete=False))
    model, live = streaming_client(model_server)

    with pytest.raises(ModelCallFailed) as failed:
        await model.complete(NO_TOOLS)

    assert "after output was delivered" in str(failed.value)
    assert failed.value.retryable is True
    assert live.text == ["partial answer"]
    assert len(model_server.requests) == 1


async def test_a_context_overflow_on_a_streaming_request_raises_at_once(model_server: ModelServer):
    model_server.queue(context_overflow_error())
    model, _ = streaming_client(model_server)

    with pytest.raises(ContextOverflow):
        await model.complete(WITH_TOOLS)

    assert len(model_server.requests) == 1


async def test_a_server_that_ignores_stream_still_answers(model_server: ModelServer):
    model_server.queue(Completion(content="not streamed"))
    model, live = streaming_client(model_server)

    response = await model.complete(NO_TOOLS)

    assert response.content == "not streamed"
    assert live.text == ["not streamed"]


async def test_a_streamed_timeout_is_retried(model_server: ModelServer):
    model_server.queue(Stream([Text("a"), Pause(2.0), Text("b")]), Stream([Text("quick")]))
    model, live = streaming_client(model_server, mode="drain", timeout_seconds=0.3)

    response = await model.complete(WITH_TOOLS)

    assert response.content == "quick"
    assert live.text == ["quick"]

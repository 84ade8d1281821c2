"""The OpenAI-compatible client against a real loopback server: bodies, retries, failover."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from runtime import http_lite, model_pool
from runtime.model_client import OpenAICompatibleClient, client_for_endpoint
from runtime.model_config import EndpointConfig, ModelParams, RetryPolicy
from runtime.scripted import ScriptedModelClient
from runtime.types import ChatRequest, ContextOverflow, ModelCallFailed
from tests.support.model_server import (
    Completion,
    Delay,
    Error,
    Hangup,
    ModelServer,
    context_overflow_error,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["httpx", "http_lite"], autouse=True)
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test of the wire runs through both transports: httpx (any event loop) and the
    small keep-alive client the run driver's pooled loop uses for plain JSON calls (here
    without keep-alive: each call's connection is closed, so no test leaves one open)."""
    if request.param == "http_lite":
        monkeypatch.setattr(http_lite, "IDLE_PER_ORIGIN", 0)
        monkeypatch.setattr(
            model_pool, "lite_pool", lambda: http_lite.Pool(model_pool.ssl_context())
        )
    return str(request.param)


FAST = RetryPolicy(base_delay=0.01, max_delay=0.02, max_retry_after=5)
ASK = ChatRequest(messages=[{"role": "user", "content": "hello"}])
READ_TOOL = {
    "type": "function",
    "function": {"name": "read", "parameters": {"type": "object", "properties": {}}},
}


def endpoint(server: ModelServer, name: str = "primary", **fields: Any) -> EndpointConfig:
    fields.setdefault("model", "test-model")
    return EndpointConfig(name=name, base_url=server.url, **fields)


def client(config: EndpointConfig, **options: Any) -> OpenAICompatibleClient:
    options.setdefault("retry", FAST)
    return OpenAICompatibleClient(config, **options)


class SleepRecorder:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- happy paths ---------------------------------------------------------------------------------


async def test_a_text_answer_carries_content_usage_reasoning_and_cost(model_server: ModelServer):
    model_server.queue(Completion(content="Hi there", reasoning="thinking", usage=(100, 20)))
    config = endpoint(model_server, input_price=0.001, output_price=0.002)

    response = await client(config).complete(ASK)

    assert response.content == "Hi there"
    assert response.reasoning_content == "thinking"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (100, 20)
    assert response.cost == pytest.approx(100 * 0.001 + 20 * 0.002)
    assert response.endpoint == "primary"
    assert response.finish_reason == "stop"
    assert response.model == "test-model"


async def test_the_request_body_maps_every_parameter_to_the_wire(model_server: ModelServer):
    model_server.queue(Completion(content="{}"))
    params = ModelParams.model_validate(
        {
            "temperature": 0.2,
            "topP": 0.9,
            "frequencyPenalty": 0.5,
            "presencePenalty": 0.25,
            "maxTokens": 512,
            "stop": ["END"],
            "responseFormat": "json_schema",
            "jsonSchema": '{"title": "Plan", "type": "object"}',
            "extraFields": {"reasoning_effort": "low"},
        }
    )
    request = ChatRequest(messages=ASK.messages, tools=[READ_TOOL], tool_choice="auto")

    await client(endpoint(model_server, params=params)).complete(request)

    body = model_server.bodies[0]
    assert body["model"] == "test-model"
    assert body["messages"] == ASK.messages
    assert (body["temperature"], body["top_p"]) == (0.2, 0.9)
    assert (body["frequency_penalty"], body["presence_penalty"]) == (0.5, 0.25)
    assert body["max_completion_tokens"] == 512
    assert "max_tokens" not in body
    assert body["stop"] == ["END"]
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Plan", "schema": {"title": "Plan", "type": "object"}},
    }
    assert body["reasoning_effort"] == "low"
    assert body["tools"] == [READ_TOOL]
    assert body["tool_choice"] == "auto"
    assert "stream" not in body


async def test_unset_parameters_are_left_to_the_provider(model_server: ModelServer):
    model_server.queue(Completion(content="ok"))

    await client(endpoint(model_server)).complete(ChatRequest(messages=ASK.messages, max_tokens=7))

    assert set(model_server.bodies[0]) == {"model", "messages", "max_completion_tokens"}


async def test_a_json_object_request_overrides_the_endpoint_format(model_server: ModelServer):
    model_server.queue(Completion(content="{}"))
    request = ChatRequest(messages=ASK.messages, response_format="json_object")

    await client(endpoint(model_server)).complete(request)

    assert model_server.bodies[0]["response_format"] == {"type": "json_object"}


async def test_tool_calls_come_back_with_their_raw_arguments(model_server: ModelServer):
    model_server.queue(
        Completion(tool_calls=[("read", '{"path": "a.txt"}'), ("write", '{"path": "b.txt"}')])
    )
    response = await client(endpoint(model_server)).complete(
        ChatRequest(messages=ASK.messages, tools=[READ_TOOL])
    )

    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("call_0", "read", '{"path": "a.txt"}'),
        ("call_1", "write", '{"path": "b.txt"}'),
    ]
    assert response.finish_reason == "tool_calls"


async def test_malformed_arguments_pass_through_unchanged(model_server: ModelServer):
    broken = '{"path": "a.txt", "content": "unterminated'
    model_server.queue(Completion(tool_calls=[("write", broken)]))

    response = await client(endpoint(model_server)).complete(ASK)

    assert response.tool_calls[0].arguments == broken


async def test_the_api_key_is_read_from_the_environment_on_every_call(model_server: ModelServer):
    model_server.queue(Completion(content="one"), Completion(content="two"))
    environ = {"LOOPWRIGHT_SECRET_MODEL_KEY": "first-key"}
    model = client(
        endpoint(model_server, api_key_env="LOOPWRIGHT_SECRET_MODEL_KEY"), environ=environ
    )

    await model.complete(ASK)
    environ["LOOPWRIGHT_SECRET_MODEL_KEY"] = "rotated-key"
    await model.complete(ASK)

    auth = [request.headers["authorization"] for request in model_server.requests]
    assert auth == ["Bearer first-key", "Bearer rotated-key"]


async def test_an_unset_key_variable_fails_without_calling_the_endpoint(model_server: ModelServer):
    model = client(endpoint(model_server, api_key_env="LOOPWRIGHT_SECRET_MISSING_KEY"), environ={})

    with pytest.raises(ModelCallFailed) as failed:
        await model.complete(ASK)

    assert "LOOPWRIGHT_SECRET_MISSING_KEY is not set" in str(failed.value)
    assert failed.value.retryable is False
    assert model_server.requests == []


# --- retries -------------------------------------------------------------------------------------


async def test_a_429_waits_as_long_as_retry_after_says(model_server: ModelServer):
    model_server.queue(Error(429, {"error": {"message": "slow down"}}, {"Retry-After": "1"}))
    model_server.queue(Completion(content="ok"))

    response = await client(endpoint(model_server)).complete(ASK)

    assert response.content == "ok"
    first, second = model_server.requests
    assert second.received_at - first.received_at >= 0.95


async def test_retry_after_is_capped(model_server: ModelServer):
    model_server.queue(Error(429, None, {"Retry-After": "3600"}), Completion(content="ok"))
    sleep = SleepRecorder()
    model = client(endpoint(model_server), sleep=sleep, retry=RetryPolicy(max_retry_after=2.5))

    await model.complete(ASK)

    assert sleep.delays == [2.5]


async def test_backoff_grows_exponentially_with_bounded_jitter(model_server: ModelServer):
    model_server.queue(*[Error(503)] * 4, Completion(content="ok"))
    sleep = SleepRecorder()
    policy = RetryPolicy(base_delay=1.0, max_delay=3.0)
    model = client(endpoint(model_server, max_retries=4), sleep=sleep, retry=policy)

    await model.complete(ASK)

    ceilings = [1.0, 2.0, 3.0, 3.0]
    assert len(sleep.delays) == 4
    for delay, ceiling in zip(sleep.delays, ceilings, strict=True):
        assert ceiling / 2 <= delay <= ceiling


async def test_server_errors_are_retried_until_one_succeeds(model_server: ModelServer):
    model_server.queue(Error(500), Error(502), Completion(content="third time"))

    response = await client(endpoint(model_server)).complete(ASK)

    assert response.content == "third time"
    assert len(model_server.requests) == 3


async def test_a_dropped_connection_is_retried(model_server: ModelServer):
    model_server.queue(Hangup(), Completion(content="ok"))

    response = await client(endpoint(model_server)).complete(ASK)

    assert response.content == "ok"
    assert len(model_server.requests) == 2


async def test_a_slow_answer_times_out_and_is_retried(model_server: ModelServer):
    model_server.queue(Delay(2.0, Completion(content="late")), Completion(content="fast"))
    config = endpoint(model_server, timeout_seconds=0.3)

    started = time.monotonic()
    response = await client(config).complete(ASK)

    assert response.content == "fast"
    assert time.monotonic() - started < 1.5


async def test_timeouts_on_every_attempt_fail_retryably(model_server: ModelServer):
    model_server.always(Delay(2.0, Completion(content="late")))
    config = endpoint(model_server, timeout_seconds=0.2, max_retries=1)

    with pytest.raises(ModelCallFailed) as failed:
        await client(config).complete(ASK)

    assert failed.value.retryable is True
    assert "timed out after 0.2s" in str(failed.value)
    assert len(model_server.requests) == 2


async def test_a_context_overflow_raises_at_once_without_retry_or_failover(
    make_model_server: Callable[[], ModelServer],
):
    primary, backup = make_model_server(), make_model_server()
    primary.queue(context_overflow_error())
    config = endpoint(primary, failover=(endpoint(backup, "backup"),))

    with pytest.raises(ContextOverflow) as overflow:
        await client(config).complete(ASK)

    assert "maximum context length" in str(overflow.value)
    assert len(primary.requests) == 1
    assert backup.requests == []


@pytest.mark.parametrize(
    "message",
    ["prompt is too long: 210000 tokens > 200000 maximum", "Too many tokens in the request"],
)
async def test_other_overflow_wordings_are_recognised(model_server: ModelServer, message: str):
    model_server.queue(Error(400, {"error": {"message": message}}))

    with pytest.raises(ContextOverflow):
        await client(endpoint(model_server)).complete(ASK)


async def test_a_bad_request_is_not_retried_nor_sent_elsewhere(
    make_model_server: Callable[[], ModelServer],
):
    primary, backup = make_model_server(), make_model_server()
    primary.queue(Error(400, {"error": {"message": "tools[0] is invalid"}}))
    config = endpoint(primary, failover=(endpoint(backup, "backup"),))

    with pytest.raises(ModelCallFailed) as failed:
        await client(config).complete(ASK)

    assert failed.value.retryable is False
    assert "HTTP 400" in str(failed.value)
    assert len(primary.requests) == 1
    assert backup.requests == []


async def test_an_unauthorized_endpoint_is_not_retried(model_server: ModelServer):
    model_server.queue(Error(401, {"error": {"message": "invalid api key"}}))

    with pytest.raises(ModelCallFailed) as failed:
        await client(endpoint(model_server)).complete(ASK)

    assert failed.value.retryable is False
    assert len(model_server.requests) == 1


# --- failover ------------------------------------------------------------------------------------


async def test_exhausted_retries_fail_over_to_the_next_endpoint(
    make_model_server: Callable[[], ModelServer],
):
    primary, backup = make_model_server(), make_model_server()
    primary.always(Error(500))
    backup.queue(Completion(content="from backup", model="backup-model"))
    backup_config = endpoint(backup, "backup", input_price=0.5)
    config = endpoint(primary, max_retries=2, failover=(backup_config,))

    response = await client(config).complete(ASK)

    assert (response.content, response.endpoint) == ("from backup", "backup")
    assert response.cost == pytest.approx(10 * 0.5)
    assert len(primary.requests) == 3
    assert len(backup.requests) == 1


async def test_failover_walks_the_endpoints_in_priority_order(
    make_model_server: Callable[[], ModelServer],
):
    primary, first, second = make_model_server(), make_model_server(), make_model_server()
    primary.always(Error(503))
    first.always(Error(503))
    second.queue(Completion(content="third endpoint"))
    config = endpoint(
        primary,
        max_retries=0,
        failover=(
            endpoint(first, "first", max_retries=0, model="other-model"),
            endpoint(second, "second", max_retries=0),
        ),
    )

    response = await client(config).complete(ASK)

    assert response.endpoint == "second"
    assert first.bodies[0]["model"] == "other-model"


async def test_an_unauthorized_primary_fails_over(make_model_server: Callable[[], ModelServer]):
    primary, backup = make_model_server(), make_model_server()
    primary.queue(Error(401))
    backup.queue(Completion(content="backup key works"))
    config = endpoint(primary, failover=(endpoint(backup, "backup"),))

    response = await client(config).complete(ASK)

    assert response.endpoint == "backup"
    assert len(primary.requests) == 1


async def test_a_refused_connection_is_retried_then_fails_over(model_server: ModelServer):
    model_server.queue(Completion(content="backup"))
    dead = EndpointConfig(
        name="dead", base_url=f"http://127.0.0.1:{closed_port()}/v1", model="m", max_retries=1
    )
    config = dataclasses.replace(dead, failover=(endpoint(model_server, "backup"),))

    response = await client(config).complete(ASK)

    assert response.endpoint == "backup"


async def test_when_every_endpoint_fails_the_error_names_each_and_is_retryable(
    make_model_server: Callable[[], ModelServer],
):
    primary, backup = make_model_server(), make_model_server()
    primary.always(Error(500, {"error": {"message": "primary down"}}))
    backup.always(Error(401, {"error": {"message": "bad key"}}))
    config = endpoint(primary, max_retries=1, failover=(endpoint(backup, "backup"),))

    with pytest.raises(ModelCallFailed) as failed:
        await client(config).complete(ASK)

    message = str(failed.value)
    assert "primary: HTTP 500" in message
    assert "backup: HTTP 401" in message
    assert failed.value.retryable is True


async def test_an_error_object_in_a_200_body_is_treated_as_a_failure(model_server: ModelServer):
    model_server.queue(
        Error(200, {"error": {"message": "upstream overloaded", "code": 503}}),
        Completion(content="ok"),
    )

    response = await client(endpoint(model_server)).complete(ASK)

    assert response.content == "ok"
    assert len(model_server.requests) == 2


async def test_a_body_that_is_not_json_is_retried(model_server: ModelServer):
    model_server.queue(Error(200, "<html>gateway</html>"), Completion(content="ok"))

    response = await client(endpoint(model_server)).complete(ASK)

    assert response.content == "ok"


def test_the_factory_picks_the_client_for_the_provider():
    http = client_for_endpoint(EndpointConfig(name="h", base_url="http://x/v1", model="m"))
    scripted = client_for_endpoint(EndpointConfig(name="s", provider="scripted", script="demo"))

    assert isinstance(http, OpenAICompatibleClient)
    assert isinstance(scripted, ScriptedModelClient)


def test_params_refuse_out_of_range_values_and_reserved_extra_fields():
    with pytest.raises(ValueError, match="temperature"):
        ModelParams.model_validate({"temperature": 2.5})
    with pytest.raises(ValueError, match="extraFields may not set messages"):
        ModelParams.model_validate({"extraFields": {"messages": []}})
    with pytest.raises(ValueError, match="needs a jsonSchema"):
        ModelParams.model_validate({"responseFormat": "json_schema"})
    assert json.loads(json.dumps(ModelParams.model_validate({"stop": "END"}).to_api())) == {
        "stop": ["END"]
    }

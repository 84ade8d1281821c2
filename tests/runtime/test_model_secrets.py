"""docs/reliability.md P2 for the model layer: a canary API key never shows up in logs or errors."""

from __future__ import annotations

import logging
import secrets
import socket
import traceback
from collections.abc import Callable

import pytest

from runtime.model_client import OpenAICompatibleClient
from runtime.model_config import EndpointConfig, RetryPolicy
from runtime.secrets import Secret, api_key_from_env, redact
from runtime.types import ChatRequest, ModelCallFailed
from tests.support.model_server import Error, ModelServer, RecordedRequest, Stream, Text

pytestmark = pytest.mark.anyio

ASK = ChatRequest(messages=[{"role": "user", "content": "hi"}])


def echo_key(status: int) -> Callable[[RecordedRequest], Error]:
    """A provider that quotes the credential it received back in its error body and headers."""

    def reply(request: RecordedRequest) -> Error:
        auth = request.headers.get("authorization", "")
        body = {"error": {"message": f"Incorrect API key provided: {auth.removeprefix('Bearer ')}"}}
        return Error(status, body, {"X-Echo": auth})

    return reply


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def everything_said(failure: BaseException) -> str:
    rendered = "".join(traceback.format_exception(failure))
    return "\n".join([str(failure), repr(failure), rendered])


async def test_a_canary_key_never_appears_in_logs_or_errors(
    make_model_server: Callable[[], ModelServer],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
):
    canary = "sk-canary-" + secrets.token_hex(16)
    monkeypatch.setenv("LOOPWRIGHT_SECRET_CANARY_KEY", canary)
    unauthorized, broken, streaming = make_model_server(), make_model_server(), make_model_server()
    unauthorized.always(echo_key(401))
    broken.always(echo_key(500))
    streaming.always(echo_key(503))
    dead_url = f"http://127.0.0.1:{closed_port()}/v1"
    endpoints = [
        EndpointConfig(name="unauthorized", base_url=unauthorized.url, model="m"),
        EndpointConfig(name="broken", base_url=broken.url, model="m", max_retries=2),
        EndpointConfig(name="refused", base_url=dead_url, model="m", max_retries=1),
        EndpointConfig(name="streaming", base_url=streaming.url, model="m", max_retries=1),
    ]
    said: list[str] = []

    with caplog.at_level(logging.DEBUG):
        for config in endpoints:
            keyed = EndpointConfig(
                **{**config.__dict__, "api_key_env": "LOOPWRIGHT_SECRET_CANARY_KEY"}
            )
            model = OpenAICompatibleClient(keyed, retry=RetryPolicy(base_delay=0, max_delay=0))
            request = ChatRequest(messages=ASK.messages, stream=config.name == "streaming")
            with pytest.raises(ModelCallFailed) as failed:
                await model.complete(request)
            said.append(everything_said(failed.value))
            said.append(repr(model))

    # The canary did go out (the servers saw it) ...
    assert unauthorized.requests[0].headers["authorization"] == f"Bearer {canary}"
    # ... and the provider's echo reached our error text, masked.
    assert "Incorrect API key provided: ***" in said[0]
    logged = caplog.text + "".join(str(r.args) for r in caplog.records)
    assert caplog.records, "DEBUG logging captured nothing; the check would prove nothing"
    assert logged.count(canary) == 0
    assert "\n".join(said).count(canary) == 0


async def test_a_streamed_answer_does_not_leak_the_key_either(
    model_server: ModelServer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    canary = "sk-canary-" + secrets.token_hex(16)
    monkeypatch.setenv("LOOPWRIGHT_SECRET_CANARY_KEY", canary)
    model_server.queue(Stream([Text("fine")]))
    config = EndpointConfig(
        name="ok", base_url=model_server.url, model="m", api_key_env="LOOPWRIGHT_SECRET_CANARY_KEY"
    )

    with caplog.at_level(logging.DEBUG):
        await OpenAICompatibleClient(config).complete(
            ChatRequest(messages=ASK.messages, stream=True)
        )

    assert canary not in caplog.text


def test_a_secret_masks_itself_everywhere_but_reveal():
    secret = Secret("sk-very-secret-value")

    assert "sk-very" not in f"{secret} {secret!r} {secret:>30} {[secret]}"
    assert secret.reveal() == "sk-very-secret-value"
    with pytest.raises(TypeError):
        __import__("pickle").dumps(secret)


def test_redact_masks_the_key_and_bearer_tokens():
    secret = Secret("abc123secretvalue")

    text = redact("key abc123secretvalue and Authorization: Bearer other-token-1234", secret)

    assert text == "key *** and Authorization: Bearer ***"


def test_an_empty_or_unset_variable_means_no_key():
    name = "LOOPWRIGHT_SECRET_X"
    assert api_key_from_env("", {name: "y"}) is None
    assert api_key_from_env(name, {name: ""}) is None
    assert api_key_from_env(name, {}) is None

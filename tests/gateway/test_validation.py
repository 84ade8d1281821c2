"""Strict request bodies at ``/v1/chat/completions``: each refusal is a 400 naming the field,
OpenAI fields nothing here acts on are refused by name, and what passes keeps the client's
messages as sent. Plus the HTTP edges (wrong method, bad JSON, deep JSON, no key) in OpenAI's
error shape from the real server."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest
from django.conf import settings

from gateway.errors import OpenAIError
from gateway.validation import chat_request, parse_body
from tests.gateway.conftest import Team

HI = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "locate", "parameters": {}}}


def refused(body: dict[str, Any]) -> OpenAIError:
    with pytest.raises(OpenAIError) as caught:
        chat_request(body)
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"model": ""}, "model"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "x", "mood": "happy"}]}, "messages[0].mood"),
        (
            {"messages": [{"role": "user", "content": [{"type": "audio", "x": 1}]}]},
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0].image_url.url",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        ({"messages": [{"role": "assistant"}]}, "messages[0].content"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens"),
        ({"n": 2}, "n"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "include_usage"),
        (
            {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
            "tools[0].function.name",
        ),
        ({"tools": [TOOL, TOOL]}, "tools[1].function.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"seed": 1}, "seed"),
        ({"logprobs": True}, "logprobs"),
        ({"stop": ["\n"]}, "stop"),
        ({"top_p": 0.5}, "top_p"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"metadata": {"k": 1}}, "metadata.k"),
    ],
)
def test_each_bad_field_is_named(extra: dict[str, Any], param: str) -> None:
    assert refused({"model": "ada", "messages": HI, **extra}).param == param


def test_a_full_request_passes_as_sent() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
        ]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "locate", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "Oslo"},
    ]  # fmt: skip
    request = chat_request(
        {
            "model": "ada",
            "messages": messages,
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "locate"}},
            "temperature": 0,
            "max_completion_tokens": 100,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "out", "schema": {}},
            },
            "stream": True,
            "stream_options": {"include_usage": True},
            "n": 1,
            "user": "end-user-7",
            "metadata": {"ticket": "42"},
        }
    )
    assert request.messages == tuple(messages)
    assert (request.max_tokens, request.temperature, request.include_usage) == (100, 0.0, True)
    assert (request.end_user, request.metadata) == ("end-user-7", {"ticket": "42"})


def test_bodies_are_bounded_json_objects() -> None:
    for raw, code in [(b"{", "invalid_json"), (b"[1]", "invalid_json"), (b"\xff", "invalid_json")]:
        with pytest.raises(OpenAIError) as caught:
            parse_body(raw)
        assert (caught.value.status, caught.value.code) == (400, code)
    deep = b'{"model": ' + b"[" * 200 + b"]" * 200 + b"}"
    with pytest.raises(OpenAIError) as too_deep:
        parse_body(deep)
    assert too_deep.value.code == "too_deep"


@pytest.mark.django_db(transaction=True)
def test_http_edges_answer_in_openai_shape(server: str, team: Team) -> None:
    key = team.caller("alice", team.employee("ada"))
    auth = {"Authorization": f"Bearer {key}"}
    url = f"{server}/v1/chat/completions"
    with httpx2.Client(timeout=30) as http:
        answers = [
            (http.get(url, headers=auth), 405),
            (http.post(url, content=b"{nope", headers=auth), 400),
            (http.post(url, json={"model": "ada", "messages": HI}), 401),
            (
                http.post(
                    url, json={"model": "ada", "messages": HI}, headers={"Authorization": "Basic x"}
                ),
                401,
            ),
            (http.get(f"{server}/v1/models", headers={"Authorization": "Bearer lw_a_b"}), 401),
            (http.post(url, content=b" " * (settings.LOOPWRIGHT_MAX_BODY_BYTES + 1)), 413),
        ]
        traced = http.get(f"{server}/v1/models", headers={**auth, "X-Request-ID": "trace-7"})
    for response, status in answers:
        assert response.status_code == status
        assert response.headers["Content-Type"] == "application/json"
        error = json.loads(response.content)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert len(response.headers["X-Request-ID"]) == 32
    assert answers[2][0].headers["WWW-Authenticate"].startswith("Bearer")
    assert answers[-1][0].json()["error"]["code"] == "request_too_large"
    assert traced.status_code == 200 and traced.headers["X-Request-ID"] == "trace-7"

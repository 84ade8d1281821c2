"""The moderation guardrail (runtime/guardrails_moderation.py) against a real loopback
``/v1/moderations`` server: flagged and clean answers, categories, the key from the environment
(sent, never shown), fail-open and fail-closed on an endpoint that errors, times out, hangs up
or answers nonsense, and the outbound guard refusing loopback when told to."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from runtime import outbound
from runtime.guardrails import StreamGate, check_input, check_output, parse_guardrail_config
from runtime.outbound import OutboundPolicy
from tests.support.model_server import Delay, Error, Hangup
from tests.support.moderation_server import Flag, ModerationServer, moderation_server

__all__ = ["moderation_server"]

pytestmark = pytest.mark.anyio

KEY_ENV = "LOOPWRIGHT_SECRET_GUARD_MODERATION"
KEY = "mod-key-7f3a9c1e5b2d8f4a6c0e"


@pytest.fixture(autouse=True)
def loopback_allowed() -> Iterator[None]:
    outbound.configure(OutboundPolicy(private="allow"))
    yield
    outbound.configure(None)


def rule(server: ModerationServer, **fields: Any) -> dict[str, Any]:
    return {"name": "mod", "kind": "moderation", "url": server.url, **fields}


async def test_a_flagged_text_blocks_and_a_clean_one_passes(
    moderation_server: ModerationServer,
) -> None:
    config = parse_guardrail_config(
        {"input": [rule(moderation_server, model="omni-moderation-latest")]}
    )
    clean = await check_input(config, [{"role": "user", "content": "plan a picnic"}])
    assert clean.blocked is None
    assert clean.decisions[0].reason == "not flagged by the moderation endpoint"
    report = await check_input(config, [{"role": "user", "content": "plan an attack"}])
    assert report.blocked is not None
    assert report.blocked.reason == "flagged by the moderation endpoint: violence"
    assert moderation_server.requests[1].body == {
        "input": "plan an attack",
        "model": "omni-moderation-latest",
    }
    assert "authorization" not in moderation_server.requests[1].headers


async def test_listed_categories_block_only_for_themselves(
    moderation_server: ModerationServer,
) -> None:
    config = parse_guardrail_config({"output": [rule(moderation_server, categories=["hate"])]})
    moderation_server.queue(Flag(("violence",)), Flag(("hate", "violence")))
    passed = await check_output(config, "first")
    assert passed.blocked is None
    assert passed.decisions[0].reason == "flagged for violence, none of the rule's categories"
    blocked = await check_output(config, "second")
    assert blocked.blocked is not None and blocked.blocked.reason.endswith(": hate")
    assert "model" not in moderation_server.requests[0].body


async def test_the_key_comes_from_the_environment_and_never_shows(
    moderation_server: ModerationServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    config = parse_guardrail_config({"input": [rule(moderation_server, apiKeyEnv=KEY_ENV)]})
    await check_input(config, [{"role": "user", "content": "hello"}])
    assert moderation_server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    moderation_server.queue(Error(401, {"error": {"message": f"bad key {KEY}"}}))
    report = await check_input(config, [{"role": "user", "content": "hello"}])
    assert report.blocked is not None and report.blocked.verdict == "error_closed"
    assert "answered 401" in report.blocked.reason and KEY not in report.blocked.reason
    monkeypatch.delenv(KEY_ENV)
    unset = await check_input(config, [{"role": "user", "content": "hello"}])
    assert unset.blocked is not None
    assert f"the environment variable {KEY_ENV} is not set" in unset.blocked.reason
    assert len(moderation_server.requests) == 2  # nothing sent without the key


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (Error(500, {"error": {"message": "moderation is down"}}), "answered 500"),
        (Delay(5, Error(200, {})), "no answer within 300 ms"),
        (Hangup(), "RemoteProtocolError"),
        ("not json at all", "unreadable answer"),
        ({"results": []}, "the answer has no results"),
    ],
    ids=["500", "timeout", "hangup", "not-json", "no-results"],
)
@pytest.mark.parametrize("fail_mode", ["open", "closed"])
async def test_an_endpoint_failure_obeys_fail_mode(
    moderation_server: ModerationServer, reply: Any, why: str, fail_mode: str
) -> None:
    config = parse_guardrail_config(
        {"output": [rule(moderation_server, failMode=fail_mode, timeoutMs=300)]}
    )
    moderation_server.queue(reply)
    started = time.monotonic()
    report = await check_output(config, "some answer")
    assert time.monotonic() - started < 2
    decision = report.decisions[0]
    assert why in decision.reason
    if fail_mode == "open":
        assert decision.verdict == "error_open" and report.blocked is None
        assert "let through (failMode open)" in decision.reason
    else:
        assert decision.verdict == "error_closed" and report.blocked == decision
        assert "blocked (failMode closed)" in decision.reason


async def test_an_unreachable_endpoint_fails_by_fail_mode(
    moderation_server: ModerationServer,
) -> None:
    url = moderation_server.url
    moderation_server.stop()
    config = parse_guardrail_config(
        {
            "input": [
                {"name": "a", "kind": "moderation", "url": url, "failMode": "open"},
                {"name": "b", "kind": "moderation", "url": url},
            ]
        }
    )
    report = await check_input(config, [{"role": "user", "content": "hi"}])
    assert [d.verdict for d in report.decisions] == ["error_open", "error_closed"]
    assert report.blocked is not None and report.blocked.rule == "b"


async def test_the_outbound_guard_decides_at_call_time(
    moderation_server: ModerationServer,
) -> None:
    config = parse_guardrail_config({"input": [rule(moderation_server)]})
    denied = OutboundPolicy(private="deny")
    report = await check_input(config, [{"role": "user", "content": "hi"}], policy=denied)
    assert report.blocked is not None and report.blocked.verdict == "error_closed"
    assert "LOOPWRIGHT_OUTBOUND_PRIVATE=deny" in report.blocked.reason
    assert moderation_server.requests == []


async def test_builtin_rules_run_first_and_spare_the_moderation_call(
    moderation_server: ModerationServer,
) -> None:
    config = parse_guardrail_config(
        {
            "input": [
                rule(moderation_server),
                {"name": "words", "kind": "blocklist", "words": ["falcon"]},
            ]
        }
    )
    report = await check_input(config, [{"role": "user", "content": "the falcon"}])
    assert [d.rule for d in report.decisions] == ["words"]
    assert moderation_server.requests == []
    report = await check_input(config, [{"role": "user", "content": "an attack"}])
    assert [(d.rule, d.verdict) for d in report.decisions] == [
        ("words", "allow"),
        ("mod", "block"),
    ]


async def test_a_stream_is_moderated_whole_at_finish(moderation_server: ModerationServer) -> None:
    config = parse_guardrail_config({"output": [rule(moderation_server)], "streamWindowChars": 8})
    stream = StreamGate(config)
    released = stream.feed("Here is the plan: ") + stream.feed("we attack at dawn")
    assert released == "Here is the plan: we attack"  # all but the window
    assert await stream.finish() == ""
    assert stream.blocked is not None and stream.blocked.kind == "moderation"
    assert moderation_server.requests[0].body == {"input": "Here is the plan: we attack at dawn"}
    calm = StreamGate(config)
    assert calm.feed("a calm answer") == "a cal"
    assert await calm.finish() == "m answer"
    assert calm.report.decisions[0].verdict == "allow"

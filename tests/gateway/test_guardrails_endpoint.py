"""Guardrails at the endpoint, through the official SDK: an input rule blocks before the model
is called (400 ``content_filter``), an output rule withholds a whole answer (non-streamed) or
stops a stream before the matching text is released (``finish_reason: "content_filter"``), a
moderation endpoint that cannot be reached blocks or lets through by its ``failMode``, and every
decision is recorded and returned as ``guardrail_metadata``."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from gateway.models import ChatCompletionRecord
from gateway.services import guardrails_update
from orchestrator.agents.models import Employee
from tests.gateway.conftest import Team
from tests.support.model_server import Completion, as_requested

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
SDK = Callable[[str], openai.OpenAI]
CARD = "4111 1111 1111 1111"


@pytest.fixture
def sdk(server: str) -> Iterator[SDK]:
    made: list[openai.OpenAI] = []

    def make(key: str) -> openai.OpenAI:
        made.append(openai.OpenAI(base_url=f"{server}/v1", api_key=key, max_retries=0))
        return made[-1]

    yield make
    for client in made:
        client.close()


def guarded(employee: Employee, **config: Any) -> None:
    guardrails_update(employee=employee, guardrails=config, actor="test")


def record() -> ChatCompletionRecord:
    deadline = time.monotonic() + 5
    while (found := ChatCompletionRecord.objects.first()) is None:
        assert time.monotonic() < deadline, "no record written"
        time.sleep(0.02)
    return found


def dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_input_rule_blocks_before_the_model(sdk: SDK, team: Team) -> None:
    ada = team.employee("ada")
    guarded(ada, input=[{"name": "no-cards", "kind": "pii", "types": ["credit_card"]}])
    key = team.caller("alice", ada)
    with pytest.raises(openai.BadRequestError) as blocked:
        sdk(key).chat.completions.create(
            model="ada", messages=[{"role": "user", "content": f"My card is {CARD}"}]
        )
    assert blocked.value.code == "content_filter"
    assert "no-cards" in blocked.value.message
    assert team.model.requests == []
    found = record()
    assert found.status == "blocked"
    (stage,) = found.guardrail_decisions
    assert (stage["stage"], stage["blocked_by"]) == ("input", "no-cards")


def test_an_output_rule_withholds_a_whole_answer(sdk: SDK, team: Team) -> None:
    ada = team.employee("ada")
    guarded(ada, output=[{"name": "no-secret", "kind": "blocklist", "words": ["swordfish"]}])
    key = team.caller("alice", ada)
    team.model.queue(Completion(content="The password is swordfish."))
    reply = sdk(key).chat.completions.create(
        model="ada", messages=[{"role": "user", "content": "password?"}]
    )
    assert reply.choices[0].finish_reason == "content_filter"
    assert not reply.choices[0].message.content
    (stage,) = (reply.model_extra or {})["guardrail_metadata"]
    assert (stage["stage"], stage["blocked_by"]) == ("output", "no-secret")
    assert record().status == "blocked"


def test_an_output_rule_stops_a_stream_before_the_match(sdk: SDK, team: Team) -> None:
    ada = team.employee("ada", streaming=True)
    guarded(
        ada,
        output=[{"name": "no-secret", "kind": "blocklist", "words": ["swordfish"]}],
        streamWindowChars=32,
    )
    key = team.caller("alice", ada)
    answer = "Here is a long and harmless preamble first. The password is swordfish, really."
    team.model.always(as_requested(lambda _r: Completion(content=answer), pieces=8))
    chunks = list(
        sdk(key).chat.completions.create(
            model="ada", messages=[{"role": "user", "content": "password?"}], stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "swordfish" not in text
    assert text and answer.startswith(text)  # what passed the window went out
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "content_filter"
    reports = [
        c.model_extra["guardrail_metadata"]
        for c in chunks
        if "guardrail_metadata" in (c.model_extra or {})
    ]
    assert reports[-1]["blocked_by"] == "no-secret"
    assert record().status == "blocked"


@pytest.mark.parametrize("stream", [False, True])
def test_with_output_rules_the_unchecked_reasoning_is_withheld(
    sdk: SDK, team: Team, stream: bool
) -> None:
    ada = team.employee("ada", streaming=stream)
    guarded(ada, output=[{"name": "no-secret", "kind": "blocklist", "words": ["swordfish"]}])
    key = team.caller("alice", ada)
    thought = Completion(content="I cannot say.", reasoning="The password is swordfish.")
    team.model.always(as_requested(lambda _r: thought))
    ask = [{"role": "user", "content": "password?"}]
    if stream:
        chunks = list(sdk(key).chat.completions.create(model="ada", messages=ask, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        text = "".join(d.content or "" for d in deltas)
        reasoning = [(d.model_extra or {}).get("reasoning_content") for d in deltas]
    else:
        reply = sdk(key).chat.completions.create(model="ada", messages=ask)
        text = reply.choices[0].message.content or ""
        reasoning = [(reply.choices[0].message.model_extra or {}).get("reasoning_content")]
    assert text == "I cannot say."
    assert not any(reasoning)
    assert record().status == "ok"


@pytest.mark.parametrize(("fail_mode", "passes"), [("open", True), ("closed", False)])
def test_an_unreachable_moderation_endpoint_fails_by_its_mode(
    sdk: SDK, team: Team, fail_mode: str, passes: bool
) -> None:
    ada = team.employee("ada")
    rule = {
        "name": "moderation",
        "kind": "moderation",
        "url": f"http://127.0.0.1:{dead_port()}/v1/moderations",
        "failMode": fail_mode,
        "timeoutMs": 500,
    }
    guarded(ada, input=[rule])
    key = team.caller("alice", ada)
    team.model.always(Completion(content="Hello."))
    ask = [{"role": "user", "content": "hi"}]
    if passes:
        reply = sdk(key).chat.completions.create(model="ada", messages=ask)
        assert reply.choices[0].message.content == "Hello."
        (stage,) = (reply.model_extra or {})["guardrail_metadata"]
        assert stage["decisions"][0]["verdict"] == "error_open"
    else:
        with pytest.raises(openai.BadRequestError) as blocked:
            sdk(key).chat.completions.create(model="ada", messages=ask)
        assert blocked.value.code == "content_filter"
    found = record()
    assert found.status == ("ok" if passes else "blocked")
    assert found.guardrail_decisions[0]["decisions"][0]["verdict"] == (
        "error_open" if passes else "error_closed"
    )

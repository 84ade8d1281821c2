"""The built-in guardrails (runtime/guardrails.py, runtime/guardrails_patterns.py) over whole
texts: each kind allows and blocks, through check_input (OpenAI messages) and check_output;
reasons mask what matched; decisions are recorded in order and stop at the first block."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runtime.guardrails import (
    GuardrailConfig,
    GuardrailDecision,
    check_input,
    check_output,
    message_text,
    parse_guardrail_config,
)
from runtime.guardrails_patterns import iban_valid, luhn_valid

pytestmark = pytest.mark.anyio


def output_rules(*rules: dict[str, Any]) -> GuardrailConfig:
    return parse_guardrail_config({"output": list(rules)})


async def verdict(rule: dict[str, Any], text: str) -> GuardrailDecision:
    report = await check_output(output_rules(rule), text)
    assert len(report.decisions) == 1
    return report.decisions[0]


BLOCKLIST = {"name": "words", "kind": "blocklist", "words": ["falcon", "Project Nightjar"]}
REGEX = {"name": "ssn", "kind": "regex", "pattern": r"\b\d{3}-\d{2}-\d{4}\b"}


@pytest.mark.parametrize(
    ("rule", "allowed", "blocked", "reason"),
    [
        (BLOCKLIST, "falconry is a hobby", "The FALCON has landed.", "'falcon'"),
        (BLOCKLIST, "project of nightjars", "about project\n  nightjar now", "'Project Nightjar'"),
        (
            REGEX,
            "call 555-12-123",
            "my ssn is 123-45-6789",
            "a match of the pattern (12*** (11 chars))",
        ),
        (
            {**REGEX, "name": "ci", "pattern": "secret plan", "ignoreCase": True},
            "a secret, plan",
            "The SECRET PLAN",
            "SE*** (11 chars)",
        ),
        ({"name": "size", "kind": "max_chars", "maxChars": 10}, "0123456789", "0123456789!", "11"),
        (
            {"name": "pii", "kind": "pii", "types": ["email"]},
            "write to us at support (at) example",
            "write to jane.roe@example.org",
            "an email address (jane*** (20 chars))",
        ),
        (
            {"name": "pii", "kind": "pii", "types": ["phone"]},
            "on 2024-01-15 at 10:30 we sold 3 items for 12.50",
            "call me on +44 20 7946 0958",
            "a phone number",
        ),
        (
            {"name": "pii", "kind": "pii", "types": ["credit_card"]},
            "order 4111 1111 1111 1112 shipped",  # fails Luhn
            "card 4111-1111-1111-1111 exp 12/29",
            "a credit card number (4111*** (16 chars))",
        ),
        (
            {"name": "pii", "kind": "pii", "types": ["iban"]},
            "ref DE89 3704 0044 0532 0130 01",  # fails mod 97
            "pay to GB82 WEST 1234 5698 7654 32 today",
            "an IBAN (GB82*** (22 chars))",
        ),
    ],
)
async def test_each_builtin_kind_allows_and_blocks(
    rule: dict[str, Any], allowed: str, blocked: str, reason: str
) -> None:
    passed = await verdict(rule, allowed)
    assert (passed.verdict, passed.stage, passed.rule) == ("allow", "output", rule["name"])
    stopped = await verdict(rule, blocked)
    assert stopped.verdict == "block" and stopped.blocks
    assert reason in stopped.reason


SECRETS = {
    "openai": "sk-proj-" + "Ab3dE5gH7jK9mN1pQ3sT5vX7zB9dF1hJ3",
    "aws": "AKIA" + "IOSFODNN7EXAMPLE",
    "github": "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "slack": "xoxb-" + "1234567890-0987654321-AbCdEfGhIjKl",
    "loopwright": "lw_0123456789ab_" + "Zx9_Yw8-Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0Fe9Dc8Ba7Zy",
}


@pytest.mark.parametrize("kind", sorted(SECRETS))
async def test_secret_shapes_block_and_their_reason_never_shows_the_secret(kind: str) -> None:
    secret = SECRETS[kind]
    rule = {"name": "keys", "kind": "secrets", "types": [kind]}
    decision = await verdict(rule, f"here you go: {secret} (keep it safe)")
    assert decision.verdict == "block"
    recorded = json.dumps(decision.as_dict())
    assert secret not in recorded and secret[6:] not in recorded
    assert f"{len(secret)} chars" in decision.reason
    assert (await verdict(rule, "a harmless answer about sk- prefixes and xox")).verdict == "allow"


async def test_a_private_key_block_is_caught_by_its_header() -> None:
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ"
    decision = await verdict({"name": "keys", "kind": "secrets"}, f"use this:\n{key}")
    assert decision.verdict == "block"
    assert "a private key block (-----BEGIN OPENSSH PRIVATE KEY-----)" in decision.reason
    assert "b3BlbnNz" not in decision.reason


def test_card_and_iban_checksums() -> None:
    assert luhn_valid("4111111111111111") and luhn_valid("378282246310005")
    assert not luhn_valid("4111111111111112")
    assert iban_valid("DE89370400440532013000") and iban_valid("NO9386011117947")
    assert not iban_valid("DE89370400440532013001") and not iban_valid("DE8937040044053201300")


def test_the_input_text_is_every_message_text_and_text_part() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is in"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,falcon"}},
                {"type": "text", "text": "this picture?"},
            ],
        },
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "tool_call_id": "c1", "content": "tool said hi"},
    ]
    assert message_text(messages) == "be brief\n\nwhat is in\n\nthis picture?\n\ntool said hi"


async def test_check_input_blocks_on_the_first_blocking_rule_and_stops() -> None:
    config = parse_guardrail_config(
        {
            "input": [
                {"name": "size", "kind": "max_chars", "maxChars": 1000},
                {"name": "words", "kind": "blocklist", "words": ["falcon"]},
                {"name": "pii", "kind": "pii"},
            ]
        }
    )
    clean = await check_input(config, [{"role": "user", "content": "hello there"}])
    assert clean.blocked is None
    assert [d.verdict for d in clean.decisions] == ["allow", "allow", "allow"]
    assert all(d.stage == "input" and d.duration_ms >= 0 for d in clean.decisions)

    messages = [{"role": "user", "content": [{"type": "text", "text": "tell me of FALCON"}]}]
    report = await check_input(config, messages)
    assert report.blocked is not None and report.blocked.rule == "words"
    assert [d.rule for d in report.decisions] == ["size", "words"]  # pii never ran
    recorded = report.as_dict()
    assert recorded["blocked"] is True and recorded["blocked_by"] == "words"
    assert recorded["decisions"][1] == {
        "stage": "input",
        "rule": "words",
        "kind": "blocklist",
        "verdict": "block",
        "reason": "contains blocked word or phrase ('falcon')",
        "duration_ms": recorded["decisions"][1]["duration_ms"],
    }


async def test_no_rules_means_an_empty_report() -> None:
    config = GuardrailConfig()
    assert (await check_input(config, [{"role": "user", "content": "x"}])).decisions == ()
    assert (await check_output(config, "anything")).blocked is None


async def test_output_rules_do_not_apply_to_input_and_back() -> None:
    config = parse_guardrail_config(
        {
            "input": [{"name": "in", "kind": "blocklist", "words": ["alpha"]}],
            "output": [{"name": "out", "kind": "blocklist", "words": ["omega"]}],
        }
    )
    assert (await check_input(config, [{"role": "user", "content": "omega"}])).blocked is None
    assert (await check_output(config, "alpha")).blocked is None
    assert (await check_output(config, "omega")).blocked is not None

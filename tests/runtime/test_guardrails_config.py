"""The guardrail configuration (runtime/guardrails_config.py): strict validation whose every
problem names its field, regexes compiled and checked for catastrophic shapes, moderation URLs
and key variables under the outbound guard and the secret rule."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from runtime import outbound
from runtime.guardrails import (
    GuardrailConfig,
    GuardrailConfigInvalid,
    guardrail_problems,
    parse_guardrail_config,
)
from runtime.outbound import OutboundPolicy


@pytest.fixture(autouse=True)
def loopback_allowed() -> Iterator[None]:
    outbound.configure(OutboundPolicy(private="allow"))
    yield
    outbound.configure(None)


def problems(data: Any) -> dict[str, str]:
    return {p["pointer"]: p["detail"] for p in guardrail_problems(data)}


def test_a_full_config_round_trips_in_camel_case() -> None:
    data = {
        "input": [
            {"name": "words", "kind": "blocklist", "words": ["falcon"]},
            {"name": "size", "kind": "max_chars", "maxChars": 1000, "failMode": "open"},
        ],
        "output": [
            {"name": "ssn", "kind": "regex", "pattern": r"\d{3}-\d{2}-\d{4}", "ignoreCase": True},
            {"name": "pii", "kind": "pii", "types": ["email", "iban"]},
            {"name": "keys", "kind": "secrets"},
            {
                "name": "mod",
                "kind": "moderation",
                "url": "http://127.0.0.1:9/v1/moderations",
                "apiKeyEnv": "LOOPWRIGHT_SECRET_MODERATION",
                "model": "omni-moderation-latest",
                "timeoutMs": 800,
                "categories": ["violence"],
            },
        ],
        "streamWindowChars": 64,
    }
    config = parse_guardrail_config(data)
    assert config.stream_window_chars == 64
    assert config.output[2].types == [  # type: ignore[union-attr]
        "openai", "aws", "github", "slack", "private_key", "loopwright"
    ]  # fmt: skip
    api = config.to_api()
    assert api["output"][0]["ignoreCase"] is True
    assert api["input"][1]["failMode"] == "open"
    assert api["output"][3]["apiKeyEnv"] == "LOOPWRIGHT_SECRET_MODERATION"
    assert parse_guardrail_config(api) == config
    assert GuardrailConfig().empty and GuardrailConfig().stream_window_chars == 256


def test_unknown_keys_are_refused_naming_the_key_and_where() -> None:
    assert problems({"inptu": []}) == {"/inptu": "unknown key 'inptu'"}
    found = problems({"input": [{"name": "w", "kind": "blocklist", "words": ["x"], "word": "y"}]})
    assert found == {"/input/0/word": "unknown key 'word'"}
    # snake_case is the Python name, not the JSON one: refused like any unknown key.
    assert problems({"stream_window_chars": 10}) == {
        "/stream_window_chars": "unknown key 'stream_window_chars'"
    }


def test_an_unknown_or_missing_kind_names_the_kinds() -> None:
    assert (
        "unknown kind 'profanity'; one of blocklist, regex, max_chars"
        in problems({"output": [{"name": "p", "kind": "profanity"}]})["/output/0/kind"]
    )
    assert "a rule needs a kind" in problems({"output": [{"name": "p"}]})["/output/0/kind"]


def test_an_invalid_regex_is_refused_naming_the_rule_and_the_field() -> None:
    with pytest.raises(GuardrailConfigInvalid) as refused:
        parse_guardrail_config({"output": [{"name": "ssn", "kind": "regex", "pattern": "(\\d"}]})
    assert refused.value.problems[0]["pointer"] == "/output/0/pattern"
    assert "rule 'ssn': invalid regex: missing )" in refused.value.problems[0]["detail"]
    assert "/output/0/pattern: rule 'ssn': invalid regex" in str(refused.value)


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("(a+)+$", "nested repeats"),
        (r"(?>(a+)+b)", "nested repeats"),
        (r"(?:\w*\s?)*x", "nested repeats"),
        (r"(x|y)\1", "backreferences are not allowed"),
        ("a{2000}", "repeat counts above 1000"),
        ("a*", "matches the empty text"),
        ("x" * 501, "at most 500 characters"),
    ],
)
def test_catastrophic_or_useless_regexes_are_refused(pattern: str, why: str) -> None:
    found = problems({"input": [{"name": "r", "kind": "regex", "pattern": pattern}]})
    assert why in found["/input/0/pattern"]


def test_possessive_nested_repeats_and_bounded_repeats_are_accepted() -> None:
    for pattern in (r"(?:\d+\.)++\d", r"(?:\w+\s)*+end", r"(?:ab){2,5}c", r"\bfalcon\b"):
        assert problems({"input": [{"name": "r", "kind": "regex", "pattern": pattern}]}) == {}


def test_values_and_types_are_checked_strictly() -> None:
    found = problems(
        {
            "input": [
                {"name": "m", "kind": "max_chars", "maxChars": "10"},
                {"name": "w", "kind": "blocklist", "words": []},
                {"name": "p", "kind": "pii", "types": ["ssn"]},
                {"name": "bad name!", "kind": "secrets"},
                {"name": "f", "kind": "secrets", "failMode": "maybe"},
            ],
            "streamWindowChars": 10**6,
        }
    )
    assert set(found) == {
        "/input/0/maxChars",
        "/input/1/words",
        "/input/2/types/0",
        "/input/3/name",
        "/input/4/failMode",
        "/streamWindowChars",
    }
    assert "less than or equal to 65536" in found["/streamWindowChars"]


def test_rule_names_are_unique_per_stage() -> None:
    rule = {"name": "keys", "kind": "secrets"}
    assert "two rules are named 'keys'" in problems({"input": [rule, rule]})["/input"]
    assert problems({"input": [rule], "output": [rule]}) == {}


def test_moderation_key_variable_follows_the_secret_rule() -> None:
    base = {"name": "mod", "kind": "moderation", "url": "https://mod.example.com/v1/moderations"}
    found = problems({"input": [{**base, "apiKeyEnv": "DATABASE_URL"}]})
    assert (
        "apiKeyEnv must name a variable starting with LOOPWRIGHT_SECRET_"
        in found["/input/0/apiKeyEnv"]
    )
    assert problems({"input": [{**base, "apiKeyEnv": "LOOPWRIGHT_SECRET_MOD"}]}) == {}


def test_moderation_url_passes_the_outbound_guard() -> None:
    base = {"name": "mod", "kind": "moderation"}
    metadata = problems({"input": [{**base, "url": "http://169.254.169.254/v1/moderations"}]})
    assert "cloud metadata address: never allowed" in metadata["/input/0/url"]
    scheme = problems({"input": [{**base, "url": "file:///etc/passwd"}]})
    assert "scheme 'file' is not allowed" in scheme["/input/0/url"]
    outbound.configure(OutboundPolicy(private="deny"))
    loopback = problems({"input": [{**base, "url": "http://127.0.0.1:1/v1/moderations"}]})
    assert "LOOPWRIGHT_OUTBOUND_PRIVATE=deny" in loopback["/input/0/url"]

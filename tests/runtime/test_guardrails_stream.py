"""StreamGate (runtime/guardrails.py): a streamed answer released as it becomes safe, a match
spanning chunks caught before any of it is released, nothing released after a block, and
(property) the released text plus finish() is the answer whenever nothing blocks."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.guardrails import GuardrailConfig, StreamGate, parse_guardrail_config

pytestmark = pytest.mark.anyio

SSN = {"name": "ssn", "kind": "regex", "pattern": r"\b\d{3}-\d{2}-\d{4}\b"}


def gate(*rules: dict[str, Any], **fields: Any) -> StreamGate:
    return StreamGate(parse_guardrail_config({"output": list(rules), **fields}))


def feed_all(stream: StreamGate, chunks: list[str]) -> str:
    return "".join(stream.feed(chunk) for chunk in chunks)


async def test_a_regex_match_spanning_chunks_is_caught_before_any_of_it_is_released() -> None:
    stream = gate(SSN, streamWindowChars=16)
    preamble = "The number you asked for is definitely this one, see: "
    released = feed_all(stream, [preamble, "12", "3-4", "5-67", "89 and more"])
    assert stream.blocked is not None and stream.blocked.rule == "ssn"
    assert stream.blocked.verdict == "block"
    assert "123" not in released and released == preamble[: len(released)]
    assert len(released) >= len(preamble) - 16  # all but the window went out
    assert stream.feed("more text") == ""
    assert await stream.finish() == ""
    assert [d.rule for d in stream.report.decisions] == ["ssn"]
    assert stream.report.blocked == stream.blocked


async def test_a_secret_split_across_many_small_chunks_never_leaks_a_character() -> None:
    stream = gate({"name": "keys", "kind": "secrets"}, streamWindowChars=64)
    secret = "sk-proj-Ab3dE5gH7jK9mN1pQ3sT5vX7zB9dF1hJ3"
    text = "Sure! " * 30 + "Your key: " + secret + " — do not share it."
    released = feed_all(stream, [text[i : i + 3] for i in range(0, len(text), 3)])
    assert stream.blocked is not None and "OpenAI API key" in stream.blocked.reason
    assert "sk-" not in released
    assert secret not in stream.blocked.reason


async def test_a_blocklist_phrase_across_a_chunk_boundary_is_caught() -> None:
    stream = gate({"name": "words", "kind": "blocklist", "words": ["project nightjar"]})
    released = feed_all(stream, ["We are not allowed to discuss Project Night", "jar at all."])
    assert released == ""  # still inside the 256-character window: not even scanned yet
    released += feed_all(stream, ["More words. " * 30])  # now text would pass the window
    assert released == ""
    assert stream.blocked is not None and stream.blocked.rule == "words"
    assert await stream.finish() == ""


async def test_text_passes_with_the_window_held_until_finish() -> None:
    stream = gate(SSN, streamWindowChars=10)
    assert stream.feed("0123456789") == ""
    assert stream.feed("abcdef") == "012345"
    assert stream.held_chars == 10
    assert await stream.finish() == "6789abcdef"
    assert stream.blocked is None and stream.released_chars == 16
    assert [(d.rule, d.verdict) for d in stream.report.decisions] == [("ssn", "allow")]


async def test_a_match_longer_than_window_and_context_is_caught_only_at_finish() -> None:
    # The documented limit: such a match is partly released before the final check sees it.
    stream = gate(
        {"name": "span", "kind": "regex", "pattern": "BEGIN[^!]{0,600}END"}, streamWindowChars=4
    )
    body = "BEGIN" + "x" * 400
    released = feed_all(stream, [body[i : i + 50] for i in range(0, len(body), 50)] + ["END"])
    assert stream.blocked is None and released.startswith("BEGIN")
    assert await stream.finish() == ""
    assert stream.blocked is not None and stream.blocked.rule == "span"
    assert stream.report.blocked == stream.blocked


async def test_max_chars_blocks_before_the_limit_is_passed_on_the_wire() -> None:
    stream = gate({"name": "size", "kind": "max_chars", "maxChars": 20})
    released = feed_all(stream, ["0123456789", "0123456789", "x", "more"])
    assert released == "01234567890123456789"  # a length limit needs no window
    assert stream.blocked is not None and "21 characters" in stream.blocked.reason
    assert await stream.finish() == ""


async def test_without_output_rules_deltas_pass_straight_through() -> None:
    stream = StreamGate(GuardrailConfig())
    assert stream.feed("hel") == "hel" and stream.feed("lo") == "lo"
    assert await stream.finish() == "" and stream.report.decisions == ()


async def test_release_at_end_holds_everything_until_the_whole_answer_passed() -> None:
    stream = gate(SSN, streamRelease="end", streamWindowChars=8)
    assert feed_all(stream, ["a" * 100, "b" * 100]) == ""
    assert await stream.finish() == "a" * 100 + "b" * 100
    held = gate(SSN, streamRelease="end", streamWindowChars=8)
    assert feed_all(held, ["x" * 50 + " 123-4", "5-6789 tail"]) == ""
    assert await held.finish() == "" and held.blocked is not None
    early = gate(SSN, streamRelease="end", streamWindowChars=8)
    assert feed_all(early, ["x" * 300 + " 123-4", "5-6789 tail", "y" * 300]) == ""
    assert early.blocked is not None  # scanned along the way: the caller may stop early
    sized = gate({"name": "size", "kind": "max_chars", "maxChars": 500}, streamRelease="end")
    assert feed_all(sized, ["z" * 100] * 4) == "" and await sized.finish() == "z" * 400
    too_long = gate({"name": "size", "kind": "max_chars", "maxChars": 500}, streamRelease="end")
    assert feed_all(too_long, ["z" * 100] * 6) == "" and too_long.blocked is not None


async def test_a_zero_window_releases_at_once_and_blocks_when_a_match_completes() -> None:
    stream = gate(SSN, streamWindowChars=0)
    assert stream.feed("id 123-45-") == "id 123-45-"  # the documented leak of window 0
    assert stream.feed("6789") == ""  # the released context still completes the match
    assert stream.blocked is not None
    assert await stream.finish() == ""


async def test_feeding_after_finish_is_a_programming_error() -> None:
    stream = gate(SSN)
    await stream.finish()
    with pytest.raises(RuntimeError):
        stream.feed("late")
    with pytest.raises(RuntimeError):
        await stream.finish()


RULES = [
    SSN,
    {"name": "words", "kind": "blocklist", "words": ["falcon", "project nightjar"]},
    {"name": "pii", "kind": "pii"},
    {"name": "keys", "kind": "secrets"},
    {"name": "size", "kind": "max_chars", "maxChars": 100_000},
]
CLEAN = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=600).filter(
    lambda t: "falcon" not in t.casefold() and "nightjar" not in t.casefold()
)


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=300, deadline=None)
@given(
    CLEAN,
    st.lists(st.integers(min_value=0, max_value=10_000), max_size=40),
    st.sampled_from([0, 1, 7, 256]),
    st.sampled_from(["window", "end"]),
)
def test_released_text_plus_finish_is_the_answer_for_any_chunking(
    text: str, cuts: list[int], window: int, release: str
) -> None:
    stream = gate(*RULES, streamWindowChars=window, streamRelease=release)
    released = feed_all(stream, chunked(text, cuts))
    assert text.startswith(released)
    rest = asyncio.run(stream.finish())
    if stream.blocked is None:
        assert released + rest == text
        assert stream.released_chars == len(text)
    else:  # the text happened to hold something PII-shaped: nothing more went out
        assert rest == ""

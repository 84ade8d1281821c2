"""An overflow answer is weighed against the request's size and the context window: a claim that
cannot be true (a request clearly within the window, numbers that contradict themselves) is a
provider fault the run retries, not ``context_overflow``; a real overflow still fails."""

from __future__ import annotations

import pytest

from runtime.compaction import WELL_WITHIN_SHARE, OverflowClaim, judge_overflow, overflow_claim
from runtime.invocation import OutcomeKind
from runtime.model_config import EndpointOverflow
from runtime.model_failures import MISREPORTED_OVERFLOW_DELAY_SECONDS, ModelTemporarilyUnavailable
from runtime.types import ContextOverflow
from tests.support.fake_model import ScriptedModel, invoke, make_invoker, text


@pytest.mark.parametrize(
    ("message", "claim"),
    [
        (
            "This model's maximum context length is 4097 tokens, however you requested 5000 "
            "tokens (4000 in your prompt)",
            OverflowClaim(4097, 5000),
        ),
        ("prompt is too long: 210000 tokens > 200000 maximum", OverflowClaim(200000, 210000)),
        ("Input is too long: max input tokens 8,192, got 9,000 tokens", OverflowClaim(8192, 9000)),
        (
            "maximum context length is 128000 tokens. However, your messages resulted in 300 "
            "tokens.",
            OverflowClaim(128000, 300),
        ),
        ("context_length_exceeded", OverflowClaim(None, None)),
    ],
)
def test_the_numbers_an_overflow_message_states_are_read(
    message: str, claim: OverflowClaim
) -> None:
    assert overflow_claim(message) == claim


def test_a_request_clearly_within_the_window_is_a_misreport() -> None:
    verdict = judge_overflow("context_length_exceeded", 300, 128_000)
    assert not verdict.real
    assert verdict.why == (
        "the request is about 300 tokens, 0.2% of the endpoint's context window (128,000 tokens)"
    )
    assert verdict.data()["overflow"] == "misreported"


def test_numbers_that_contradict_themselves_are_a_misreport() -> None:
    verdict = judge_overflow(
        "maximum context length is 8000 tokens, you requested 7000 tokens", 7_500, 8_000
    )
    assert not verdict.real
    assert "within its own limit of 8,000" in verdict.why


def test_the_providers_stated_limit_is_what_the_request_is_judged_against() -> None:
    # Configured for 128k, but the provider says 4,096 and the request is most of that.
    verdict = judge_overflow("maximum context length is 4096 tokens", 3_000, 128_000)
    assert verdict.real
    assert verdict.window == 4096
    assert "of the limit the provider states (4,096 tokens)" in verdict.why


def test_a_request_above_the_well_within_share_is_taken_at_its_word() -> None:
    window = 10_000
    share = int(window * WELL_WITHIN_SHARE)
    assert not judge_overflow("too long", share, window).real
    assert judge_overflow("too long", share + 1, window).real


def test_the_loop_retries_a_misreported_overflow_instead_of_failing() -> None:
    model = ScriptedModel(
        EndpointOverflow("HTTP 400: context_length_exceeded", endpoint="ep", context_window=8192)
    )
    with pytest.raises(ModelTemporarilyUnavailable) as raised:
        invoke(make_invoker(model, []))
    exc = raised.value
    assert exc.delay_seconds == MISREPORTED_OVERFLOW_DELAY_SECONDS
    assert exc.detail["endpoint"] == "ep"
    assert exc.detail["error"].startswith("misreported context overflow (the request is about ")
    assert "of the endpoint's context window (8,192 tokens)" in exc.detail["error"]
    assert exc.detail["overflow"] == "misreported"
    assert len(model.requests) == 1  # no compaction, no re-issue: the claim cannot be true


def test_a_real_overflow_still_fails_with_the_verdict_in_its_reason() -> None:
    small = "maximum context length is 10 tokens; you requested 60 tokens"
    model = ScriptedModel(ContextOverflow(small), ContextOverflow(small))
    outcome, journal = invoke(make_invoker(model, []))
    assert (outcome.kind, outcome.code) == (OutcomeKind.FAILED, "context_overflow")
    assert "the overflow is judged real: the request is about " in outcome.reason
    assert outcome.output["overflow"] == "real"
    assert outcome.output["claimed_limit"] == 10
    assert journal.of_kind("model") == []


def test_an_overflow_that_compaction_makes_implausible_is_retried() -> None:
    """The first answer is real for the request as it was; after the forced compaction the
    request is well within the window, so a second overflow answer is a provider fault."""
    model = ScriptedModel(
        ContextOverflow("maximum context length is 40 tokens"),
        ContextOverflow("maximum context length is 100000 tokens"),
        text("unused"),
    )
    with pytest.raises(ModelTemporarilyUnavailable):
        invoke(make_invoker(model, []))
    assert len(model.requests) == 2

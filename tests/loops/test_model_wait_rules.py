"""The pure rules of a model wait: ``limits.modelRetryWindowMs`` as a bound, the next park's
length within it, and the reason a run fails with when the window is over."""

from __future__ import annotations

from decimal import Decimal

from loops.services.harness_limits import (
    MODEL_RETRY_WINDOW,
    MODEL_RETRY_WINDOW_DEFAULT_MS,
    HarnessBound,
    model_retry_delay,
    model_retry_window,
    model_unavailable_reason,
)

WINDOW = HarnessBound(MODEL_RETRY_WINDOW, Decimal(60_000), "profile:p@1")


def test_the_window_comes_from_the_snapshot_with_its_layer() -> None:
    snapshot = {
        "settings": {"limits": {"modelRetryWindowMs": 5000}},
        "provenance": {"limits.modelRetryWindowMs": "run"},
    }
    assert model_retry_window(snapshot).label == "limits.modelRetryWindowMs = 5000 (set by run)"


def test_a_snapshot_from_before_the_setting_gets_the_platform_default() -> None:
    window = model_retry_window({"settings": {"limits": {"timeoutMs": 1000}}})
    assert (window.value, window.layer) == (Decimal(MODEL_RETRY_WINDOW_DEFAULT_MS), "default")


def test_a_park_waits_for_the_hint_but_never_past_the_window() -> None:
    assert model_retry_delay(WINDOW, waited=10, delay=30) == 30
    assert model_retry_delay(WINDOW, waited=50, delay=30) == 10  # the last try at the end
    assert model_retry_delay(WINDOW, waited=60, delay=30) is None
    assert model_retry_delay(WINDOW, waited=75, delay=1) is None


def test_a_window_of_zero_allows_no_wait() -> None:
    zero = HarnessBound(MODEL_RETRY_WINDOW, Decimal(0), "run")
    assert model_retry_delay(zero, waited=0, delay=5) is None


def test_the_reason_names_the_setting_the_endpoint_and_the_last_error() -> None:
    detail = {
        "endpoint": "gpu-box",
        "error": "HTTP 500: upstream exploded",
        "refused": "circuit open, next probe in 40s",
    }
    assert model_unavailable_reason(WINDOW, detail, 61.04, 7) == (
        "limits.modelRetryWindowMs = 60000 (set by profile:p@1): model endpoint gpu-box did not "
        "answer for 61.0 s, 7 tries; last error: HTTP 500: upstream exploded; then circuit "
        "open, next probe in 40s"
    )


def test_a_wait_that_only_saw_refusals_names_the_refusal_once() -> None:
    detail = {"endpoint": "gpu-box", "error": "", "refused": "circuit open, next probe in 40s"}
    assert model_unavailable_reason(WINDOW, detail, 60.0, 1).endswith(
        "model endpoint gpu-box did not answer for 60.0 s; last error: circuit open, next "
        "probe in 40s"
    )

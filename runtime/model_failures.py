"""A model call that failed in a way worth retrying later, as the engine's retry (a run parks
and tries again): the delay from the providers' hints, and what failed, for the run's wait
record. The engine bounds the wait (``limits.modelRetryWindowMs``)."""

from __future__ import annotations

from typing import Any

from runtime.compaction import OverflowVerdict
from runtime.invocation import RetryLater
from runtime.model_config import EndpointOverflow, EndpointsFailed
from runtime.types import ContextOverflow, ModelCallFailed


class ModelTemporarilyUnavailable(RetryLater):
    """Every model endpoint failed in a way worth retrying later (rate limits, outages, an
    overflow answer that cannot be true).

    Raised out of ``invoke`` so the engine can re-queue the run with a delay; nothing of the
    failed step was persisted, so the retry re-issues that step. ``detail`` says what failed,
    for the run's wait record: ``endpoint`` and ``error`` (the last error an endpoint itself
    gave), ``circuit`` (true when that was only an open circuit's refusal) and ``failures``
    (every endpoint's, in chain order).
    """

    def __init__(
        self,
        reason: str,
        delay_seconds: float,
        detail: dict[str, Any],
        *,
        rate_limited: bool = False,
    ) -> None:
        super().__init__(reason, delay_seconds)
        self.detail = detail
        #: Every endpoint that answered said 429 (the others only refused by open circuits).
        self.rate_limited = rate_limited


#: How long a run parks when every endpoint is down: the providers' own hint (an open
#: circuit's next probe, a probe's answer, a Retry-After) within these bounds, else the default.
#: The upper bound is above any endpoint breaker's longest cooldown (10 minutes, or its base).
PARK_DELAY_DEFAULT_SECONDS = 30.0
PARK_DELAY_BOUNDS = (1.0, 3600.0)
#: How long a run parks after an overflow answer judged misreported (a provider fault).
MISREPORTED_OVERFLOW_DELAY_SECONDS = 10.0


def park_delay(exc: ModelCallFailed) -> float:
    """How long the run parks after ``exc``: its hint within the bounds, else the default."""
    if exc.retry_after is None:
        return PARK_DELAY_DEFAULT_SECONDS
    low, high = PARK_DELAY_BOUNDS
    return min(max(exc.retry_after, low), high)


def failure_detail(exc: ModelCallFailed) -> dict[str, Any]:
    """What a failed model call says about its endpoints, for the run's wait record."""
    failures = exc.failures if isinstance(exc, EndpointsFailed) else ()
    last = exc.last_error() if isinstance(exc, EndpointsFailed) else None
    return {
        "endpoint": last.endpoint if last else "",
        "error": last.detail if last else str(exc),
        "circuit": bool(last and last.circuit),
        "failures": [{"endpoint": f.endpoint, "error": f.detail} for f in failures],
    }


def temporarily_unavailable(exc: ModelCallFailed) -> ModelTemporarilyUnavailable:
    """The retry a call whose every endpoint failed (retryably) turns into."""
    failures = exc.failures if isinstance(exc, EndpointsFailed) else ()
    answered = [f for f in failures if not f.circuit]
    rate_limited = bool(answered) and all(f.rate_limited for f in answered)
    return ModelTemporarilyUnavailable(
        str(exc), park_delay(exc), failure_detail(exc), rate_limited=rate_limited
    )


def misreported_overflow(
    exc: ContextOverflow, verdict: OverflowVerdict
) -> ModelTemporarilyUnavailable:
    """The retry an overflow answer judged misreported (a provider fault) turns into."""
    endpoint = exc.endpoint if isinstance(exc, EndpointOverflow) else ""
    error = f"misreported context overflow ({verdict.why}): {exc}"
    reason = f"model call failed ({endpoint or 'model'}: {error})"
    detail = {
        "endpoint": endpoint,
        "error": error,
        "circuit": False,
        "failures": [{"endpoint": endpoint, "error": error}],
        **verdict.data(),
    }
    return ModelTemporarilyUnavailable(reason, MISREPORTED_OVERFLOW_DELAY_SECONDS, detail)

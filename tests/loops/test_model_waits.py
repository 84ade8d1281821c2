"""A run whose model calls keep failing ends within ``limits.modelRetryWindowMs``; its wait is
one event when it starts and one when it ends; its park follows the endpoint breaker's next
probe; an overflow answer that cannot be true is a provider fault, not ``context_overflow``.

Real parts: the production engine, tool loop, journal and HTTP model client (its endpoint
breaker over the database store) against the loopback model server
(``tests.support.model_waits.HttpEngine``), on the suite's database (SQLite or PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from loops.models import LoopEvent, LoopPattern, LoopRun, RunStatus
from loops.services.breakers import breaker_refusal
from loops.services.runs import run_act, run_trigger
from orchestrator.errors import Conflict
from tests.support.factories import make_pattern
from tests.support.model_server import Delay, Error, ModelServer, RecordedRequest
from tests.support.model_waits import HttpEngine, role_reply

pytestmark = pytest.mark.django_db
WINDOW_MS = 2000
#: What a run may take past its window: the last try (a timeout or a refusal) and the polls.
SLACK_SECONDS = 2.5


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer() as model:
        yield model


def trigger(pattern: LoopPattern, window_ms: int = WINDOW_MS) -> LoopRun:
    return run_trigger(
        pattern=pattern,
        actor="operator",
        harness_overrides={"limits": {"modelRetryWindowMs": window_ms}},
    )


def events(run: LoopRun) -> list[LoopEvent]:
    return list(LoopEvent.objects.filter(run=run).order_by("seq"))


def during_wait(run: LoopRun) -> list[str]:
    """The types of the events from the wait's start (``run.retry_later``) to its end."""
    types = [e.type for e in events(run)]
    start = types.index("run.retry_later")
    end = types.index("wait.ended", start)
    return types[start : end + 1]


def first_park(run: LoopRun) -> LoopEvent:
    return LoopEvent.objects.get(run=run, type="run.retry_later")


def elapsed_since_first_park(run: LoopRun) -> float:
    run.refresh_from_db()
    assert run.finished_at is not None
    return (run.finished_at - first_park(run).created_at).total_seconds()


# --- A: an end for every wait ----------------------------------------------------------------


def test_an_endpoint_that_always_answers_500_ends_the_run_within_the_window(
    server: ModelServer,
) -> None:
    server.always(Error(500, {"error": {"message": "upstream exploded"}}))
    engine = HttpEngine(server, cooldown_seconds=0.4)
    run = trigger(make_pattern())

    run = engine.settle(run.id, within=WINDOW_MS / 1000 + 15)

    assert (run.status, run.terminal_reason) == (RunStatus.FAILED, "model_unavailable")
    assert run.failure_reason.startswith(
        f"limits.modelRetryWindowMs = {WINDOW_MS} (set by run): model endpoint "
        f"{engine.config.name} did not answer for "
    )
    assert "last error: HTTP 500" in run.failure_reason
    assert "upstream exploded" in run.failure_reason
    assert WINDOW_MS / 1000 <= elapsed_since_first_park(run) <= WINDOW_MS / 1000 + SLACK_SECONDS
    assert engine.drives >= 3  # it did retry, more than once
    # The wait: one event when it started, one when it ended, whatever the polls.
    assert during_wait(run) == ["run.retry_later", "wait.ended"]
    ended = LoopEvent.objects.get(run=run, type="wait.ended")
    assert ended.data["kind"] == "model" and ended.data["polls"] >= 2
    failed = LoopEvent.objects.get(run=run, to_status=RunStatus.FAILED)
    assert failed.seq == ended.seq + 1
    assert failed.data["setting"] == "limits.modelRetryWindowMs"
    assert failed.data["endpoint"] == engine.config.name


def test_an_endpoint_slower_than_its_timeout_ends_the_run_within_the_window(
    server: ModelServer,
) -> None:
    server.always(Delay(1.5, Error(500)))
    engine = HttpEngine(server, timeout_seconds=0.3, cooldown_seconds=0.4)
    run = trigger(make_pattern())

    run = engine.settle(run.id, within=WINDOW_MS / 1000 + 15)

    assert (run.status, run.terminal_reason) == (RunStatus.FAILED, "model_unavailable")
    assert engine.config.name in run.failure_reason
    assert "last error: timed out after 0.3s" in run.failure_reason
    assert elapsed_since_first_park(run) <= WINDOW_MS / 1000 + SLACK_SECONDS
    assert during_wait(run) == ["run.retry_later", "wait.ended"]


def test_a_window_of_zero_fails_the_run_at_the_first_failed_call(server: ModelServer) -> None:
    server.always(Error(503))
    engine = HttpEngine(server)
    run = trigger(make_pattern(), window_ms=0)

    run = engine.settle(run.id, within=10)

    assert (run.status, run.terminal_reason) == (RunStatus.FAILED, "model_unavailable")
    assert "limits.modelRetryWindowMs = 0 (set by run)" in run.failure_reason
    assert "HTTP 503" in run.failure_reason
    types = [e.type for e in events(run)]
    assert "run.retry_later" not in types and "wait.ended" not in types
    assert engine.drives == 1


def test_runs_ended_by_a_dead_endpoint_open_the_patterns_breaker(server: ModelServer) -> None:
    server.always(Error(500, {"error": {"message": "down"}}))
    engine = HttpEngine(server, cooldown_seconds=0.2)
    pattern = make_pattern(policy={"circuitBreaker": {"failureThreshold": 2}})

    first = engine.settle(trigger(pattern, 300).id, within=10)
    assert breaker_refusal(pattern) is None
    second = engine.settle(trigger(pattern, 300).id, within=10)

    assert [first.terminal_reason, second.terminal_reason] == ["model_unavailable"] * 2
    assert "circuit breaker open after 2 consecutive failed runs" in (
        breaker_refusal(pattern) or ""
    )
    with pytest.raises(Conflict, match="refuses new runs"):
        trigger(pattern)
    tripped = LoopEvent.objects.get(run=second, to_status=RunStatus.FAILED)
    assert tripped.data["breaker"]["state"] == "open"


# --- B: retries wait for the breaker's next probe --------------------------------------------


def test_the_park_follows_the_endpoint_breakers_next_probe_not_its_timeout(
    server: ModelServer,
) -> None:
    server.always(Error(500))
    # A 0.5 s timeout and a 20 s cooldown: the run waits for the probe, not 1.5 s.
    engine = HttpEngine(server, timeout_seconds=0.5, cooldown_seconds=20)
    run = trigger(make_pattern(), window_ms=600_000)

    assert engine.drive(run.id)
    run.refresh_from_db()
    park = first_park(run)
    assert run.status == RunStatus.QUEUED
    assert 18 <= park.data["delay_seconds"] <= 20
    assert run.not_before is not None
    assert 17 <= (run.not_before - park.created_at).total_seconds() <= 21
    assert park.data["kind"] == "model"
    assert park.data["endpoint"] == engine.config.name
    assert park.data["error"].startswith("HTTP 500")
    # Woken early (an operator, a nudge): the circuit refuses without a request, the run parks
    # again until the same probe, and writes no event.
    LoopRun.objects.filter(pk=run.id).update(not_before=None)
    before = len(server.requests)
    assert engine.drive(run.id)
    run.refresh_from_db()
    assert len(server.requests) == before
    assert run.wait["polls"] == 2
    assert run.wait["detail"]["error"].startswith("HTTP 500")  # the endpoint's own error
    assert run.wait["detail"]["refused"].startswith("circuit open, next probe in ")
    assert (run.not_before - park.created_at).total_seconds() >= 17
    assert [e.type for e in events(run)].count("run.retry_later") == 1
    assert events(run)[-1].type == "run.retry_later"


def test_a_long_wait_that_ends_with_an_answer_writes_one_start_and_one_end(
    server: ModelServer,
) -> None:
    failures = {"left": 6}

    def flaky(request: RecordedRequest) -> Any:
        if failures["left"] > 0:
            failures["left"] -= 1
            return Error(502, {"error": {"message": "bad gateway"}})
        return role_reply(request)

    server.always(flaky)
    engine = HttpEngine(server, cooldown_seconds=0.01)
    run = trigger(make_pattern(), window_ms=600_000)

    run = engine.settle(run.id, within=30, skip_waits=True)

    assert run.status == RunStatus.SUCCEEDED, run.failure_reason
    assert run.wait == {}
    assert during_wait(run) == ["run.retry_later", "wait.ended"]
    ended = LoopEvent.objects.get(run=run, type="wait.ended")
    assert ended.data["ended_by"] == "model.answered"
    assert ended.data["polls"] == 6
    assert ended.data["detail"]["error"].startswith("HTTP 502")
    assert ended.to_status == RunStatus.RUNNING


def test_a_run_canceled_in_its_model_wait_ends_the_wait_with_it(server: ModelServer) -> None:
    server.always(Error(500))
    engine = HttpEngine(server, cooldown_seconds=30)
    run = trigger(make_pattern(), window_ms=600_000)
    assert engine.drive(run.id)

    run_act(run_id=run.id, action="cancel", actor="operator", reason="endpoint is gone")

    run.refresh_from_db()
    assert (run.status, run.wait) == (RunStatus.CANCELED, {})
    assert during_wait(run) == ["run.retry_later", "wait.ended"]
    ended = LoopEvent.objects.get(run=run, type="wait.ended")
    assert (ended.data["kind"], ended.data["to"]) == ("model", RunStatus.CANCELED)
    assert events(run)[-1].to_status == RunStatus.CANCELED


# --- D: overflow answers that cannot be true -------------------------------------------------


def test_a_misreported_overflow_on_a_small_prompt_is_retried_not_a_context_overflow(
    server: ModelServer,
) -> None:
    overflow = Error(
        400,
        {
            "error": {
                "message": "This model's maximum context length is 128000 tokens. However, "
                "your messages resulted in 200000 tokens.",
                "code": "context_length_exceeded",
            }
        },
    )
    server.queue(overflow, overflow)
    server.always(role_reply)
    engine = HttpEngine(server)
    run = trigger(make_pattern(), window_ms=600_000)

    run = engine.settle(run.id, within=30, skip_waits=True)

    assert run.status == RunStatus.SUCCEEDED, run.failure_reason
    park = first_park(run)
    assert park.data["error"].startswith("misreported context overflow (the request is about ")
    assert park.data["overflow"]["overflow"] == "misreported"
    assert park.data["endpoint"] == engine.config.name
    assert during_wait(run) == ["run.retry_later", "wait.ended"]


def test_a_real_overflow_still_fails_the_run_as_context_overflow(server: ModelServer) -> None:
    server.always(
        Error(
            400,
            {
                "error": {
                    "message": "maximum context length is 40 tokens, you requested 900 tokens",
                    "code": "context_length_exceeded",
                }
            },
        )
    )
    engine = HttpEngine(server)
    run = trigger(make_pattern(), window_ms=600_000)

    run = engine.settle(run.id, within=20)

    assert (run.status, run.terminal_reason) == (RunStatus.FAILED, "context_overflow")
    assert "the overflow is judged real: the request is about " in run.failure_reason
    assert "of the limit the provider states (40 tokens)" in run.failure_reason
    assert not LoopEvent.objects.filter(run=run, type="run.retry_later").exists()
    assert len(server.requests) == 2  # the step and its one re-issue after a forced compaction

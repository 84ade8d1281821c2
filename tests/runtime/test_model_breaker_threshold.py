"""The breaker's shared failure threshold (docs/reliability.md P5: "opens after <= 5 consecutive
failures"): failed requests of every caller count, so concurrent callers cannot each spend
their full retry budget on an endpoint that is down, and a success starts the count again.
Both stores (database rows, and Redis when ``REDIS_URL`` is set)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from runtime.breaker import (
    FAILURE_THRESHOLD,
    BreakerState,
    BreakerStore,
)
from runtime.breaker import CircuitBreaker as Breaker
from runtime.model_client import OpenAICompatibleClient
from runtime.types import ModelCallFailed
from tests.runtime.test_model_breaker import ASK, FAST, KEY, endpoint, read
from tests.support.breakers import FakeClock
from tests.support.model_server import Completion, Delay, Error, ModelServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anyio]


async def test_one_caller_with_a_large_retry_budget_stops_at_the_threshold(
    store: BreakerStore, clock: FakeClock, model_server: ModelServer
) -> None:
    model_server.always(Error(500))
    breaker = Breaker(store, now=clock.now)
    model = OpenAICompatibleClient(
        endpoint(model_server, max_retries=10), breaker=breaker, retry=FAST
    )
    with pytest.raises(ModelCallFailed) as failed:
        await model.complete(ASK)

    assert len(model_server.requests) == FAILURE_THRESHOLD
    assert failed.value.retryable and "circuit open" in str(failed.value)
    assert (await read(breaker)).state is BreakerState.OPEN


async def test_concurrent_callers_share_the_count(
    store: BreakerStore, clock: FakeClock, model_server: ModelServer
) -> None:
    model_server.always(Delay(0.05, Error(500)))
    breaker = Breaker(store, now=clock.now)
    callers = 4
    models = [
        OpenAICompatibleClient(endpoint(model_server, max_retries=3), breaker=breaker, retry=FAST)
        for _ in range(callers)
    ]
    results = await asyncio.gather(*(m.complete(ASK) for m in models), return_exceptions=True)

    assert all(isinstance(r, ModelCallFailed) for r in results)
    # Without a shared count: 4 callers x 4 attempts = 16. With it: the threshold, plus at
    # most one request per other caller that was already on the wire when it was reached.
    assert len(model_server.requests) <= FAILURE_THRESHOLD + callers - 1
    assert (await read(breaker)).state is BreakerState.OPEN


async def test_a_success_starts_the_count_again(
    store: BreakerStore, clock: FakeClock, make_model_server: Callable[[], ModelServer]
) -> None:
    server = make_model_server()
    breaker = Breaker(store, now=clock.now)
    model = OpenAICompatibleClient(endpoint(server, max_retries=3), breaker=breaker, retry=FAST)
    for _ in range(3):  # 3 x (2 failures + 1 success): 6 failures, never 5 in a row
        server.queue(Error(500), Error(503), Completion(content="ok"))
        assert (await model.complete(ASK)).content == "ok"
        snapshot = await read(breaker)
        assert snapshot.state is BreakerState.CLOSED and snapshot.failures == 0

    assert len(server.requests) == 9
    assert (await read(breaker, KEY)).state is BreakerState.CLOSED

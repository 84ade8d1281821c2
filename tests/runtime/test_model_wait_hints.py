"""How long a failed model call says to wait follows the endpoint breaker: its next probe while
it is open (not one request timeout), a probe's answer while one is in flight, the doubled
cooldown after a failed probe; and a parked run waits exactly that (within its bounds).

Both shared breaker stores, a fake clock, the loopback model server."""

from __future__ import annotations

import functools

import pytest

from runtime.breaker import BreakerStore, CircuitBreaker
from runtime.model_client import OpenAICompatibleClient
from runtime.model_config import EndpointConfig, EndpointsFailed, RetryPolicy
from runtime.model_failures import PARK_DELAY_BOUNDS, failure_detail, park_delay
from runtime.types import ChatRequest, ModelCallFailed
from tests.support.breakers import FakeClock
from tests.support.model_server import Delay, Error, ModelServer

pytestmark = pytest.mark.django_db(transaction=True)
ASK = ChatRequest(messages=[{"role": "user", "content": "hi"}])
FAST = RetryPolicy(base_delay=0.001, max_delay=0.002)


def endpoint(server: ModelServer, **fields: object) -> EndpointConfig:
    return EndpointConfig(name="primary", base_url=server.url, model="m", **fields)  # type: ignore[arg-type]


async def failed(model: OpenAICompatibleClient) -> EndpointsFailed:
    with pytest.raises(EndpointsFailed) as raised:
        await model.complete(ASK)
    return raised.value


@pytest.mark.anyio
async def test_an_open_circuit_says_its_next_probe_not_the_request_timeout(
    store: BreakerStore, clock: FakeClock, model_server: ModelServer
) -> None:
    model_server.always(Error(500, {"error": {"message": "boom"}}))
    breaker = CircuitBreaker(store, now=clock.now)
    config = endpoint(model_server, timeout_seconds=2, max_retries=0, circuit_cooldown_seconds=60)
    model = OpenAICompatibleClient(config, breaker=breaker, retry=FAST)

    tripped = await failed(model)
    assert tripped.retry_after == pytest.approx(60)
    clock.advance(2)
    refused = await failed(model)

    assert refused.retry_after == pytest.approx(58)
    assert "circuit open, next probe in 58s" in str(refused)
    assert park_delay(refused) == pytest.approx(58)
    assert len(model_server.requests) == 1
    # The refusal says nothing new about the endpoint: its own error stays the last one.
    [failure] = refused.failures
    assert failure.circuit and failure.endpoint == "primary"
    assert failure_detail(refused)["circuit"] is True


@pytest.mark.anyio
async def test_a_failed_probe_says_the_doubled_cooldown(
    store: BreakerStore, clock: FakeClock, model_server: ModelServer
) -> None:
    model_server.always(Error(503))
    breaker = CircuitBreaker(store, now=clock.now)
    config = endpoint(model_server, timeout_seconds=2, max_retries=0, circuit_cooldown_seconds=60)
    model = OpenAICompatibleClient(config, breaker=breaker, retry=FAST)
    await failed(model)
    clock.advance(60)

    probe = await failed(model)

    assert probe.retry_after == pytest.approx(120)
    assert failure_detail(probe) == {
        "endpoint": "primary",
        "error": probe.failures[0].detail,
        "circuit": False,
        "failures": [{"endpoint": "primary", "error": probe.failures[0].detail}],
    }
    assert probe.failures[0].detail.startswith("HTTP 503")


@pytest.mark.anyio
async def test_while_a_probe_is_in_flight_the_wait_is_one_request_timeout(
    store: BreakerStore, clock: FakeClock, model_server: ModelServer
) -> None:
    model_server.always(Delay(0.3, Error(500)))
    breaker = CircuitBreaker(store, now=clock.now)
    config = endpoint(model_server, timeout_seconds=2, max_retries=0, circuit_cooldown_seconds=60)
    key = config.breaker_key
    opened = await breaker.admit(key, probe_lease=config.probe_lease)
    await breaker.record_failure(opened, cooldown=60)
    clock.advance(60)
    probe = await breaker.admit(key, probe_lease=config.probe_lease)  # someone else's probe
    model = OpenAICompatibleClient(config, breaker=breaker, retry=FAST)

    refused = await failed(model)

    assert refused.retry_after == pytest.approx(3)  # the probe's answer, not its 120 s lease
    assert "a probe is in flight" in str(refused)
    assert len(model_server.requests) == 0
    await breaker.record_failure(probe, cooldown=60)
    assert await breaker.store.run(functools.partial(breaker.next_probe_in_sync, key)) == (
        pytest.approx(120)
    )


def test_the_park_delay_is_the_hint_within_its_bounds() -> None:
    low, high = PARK_DELAY_BOUNDS
    assert park_delay(ModelCallFailed("x", retryable=True, retry_after=0.01)) == low
    assert park_delay(ModelCallFailed("x", retryable=True, retry_after=600)) == 600
    assert park_delay(ModelCallFailed("x", retryable=True, retry_after=10**6)) == high
    assert high >= 600  # above the endpoint breaker's longest cooldown

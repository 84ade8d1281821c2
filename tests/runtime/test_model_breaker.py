"""The endpoint circuit breaker with both shared stores (database rows and Redis).

Time is a fake clock handed to the breaker, so cooldowns of minutes take no wall time.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from django.db import connections

from runtime.breaker import (
    BreakerSnapshot,
    BreakerState,
    BreakerStore,
    CircuitBreaker,
    RedisBreakerStore,
    Verdict,
)
from runtime.model_client import OpenAICompatibleClient
from runtime.model_config import EndpointConfig, RetryPolicy
from runtime.types import ChatRequest, ModelCallFailed
from tests.support.breakers import FakeClock
from tests.support.model_server import Completion, Delay, Error, ModelServer, RecordedRequest

KEY = "model-endpoint:primary"
LEASE = 120.0
ASK = ChatRequest(messages=[{"role": "user", "content": "hi"}])
FAST = RetryPolicy(base_delay=0.001, max_delay=0.002)

# Real commits: the database store is exercised from several threads and connections.
pytestmark = pytest.mark.django_db(transaction=True)


async def read(breaker: CircuitBreaker, key: str = KEY) -> BreakerSnapshot:
    return await breaker.store.run(functools.partial(breaker.snapshot, key))


def endpoint(server: ModelServer, name: str = "primary", **fields: Any) -> EndpointConfig:
    return EndpointConfig(name=name, base_url=server.url, model="m", **fields)


# --- the state machine ---------------------------------------------------------------------------


def test_a_closed_breaker_admits_calls(store: BreakerStore, clock: FakeClock):
    breaker = CircuitBreaker(store, now=clock.now)

    assert breaker.admit_sync(KEY, probe_lease=LEASE).verdict is Verdict.ALLOW
    assert breaker.snapshot(KEY).state is BreakerState.CLOSED


def test_exhaustion_trips_it_and_it_refuses_calls_while_cooling(
    store: BreakerStore, clock: FakeClock
):
    breaker = CircuitBreaker(store, now=clock.now)
    breaker.record_failure_sync(breaker.admit_sync(KEY, probe_lease=LEASE), cooldown=60)

    clock.advance(59)
    refused = breaker.admit_sync(KEY, probe_lease=LEASE)

    assert refused.verdict is Verdict.DENY
    assert refused.retry_in == pytest.approx(1)
    snapshot = breaker.snapshot(KEY)
    assert (snapshot.state, snapshot.cooldown, snapshot.failures) == (BreakerState.OPEN, 60, 1)


def test_concurrent_trips_count_once(store: BreakerStore, clock: FakeClock):
    breaker = CircuitBreaker(store, now=clock.now)
    admissions = [breaker.admit_sync(KEY, probe_lease=LEASE) for _ in range(3)]

    for admission in admissions:
        breaker.record_failure_sync(admission, cooldown=60)

    assert breaker.snapshot(KEY).cooldown == 60
    assert breaker.snapshot(KEY).failures == 1


def test_failed_probes_double_the_cooldown_up_to_ten_minutes(store: BreakerStore, clock: FakeClock):
    breaker = CircuitBreaker(store, now=clock.now)
    breaker.record_failure_sync(breaker.admit_sync(KEY, probe_lease=LEASE), cooldown=60)
    cooldowns = []

    for _ in range(6):
        clock.advance(breaker.snapshot(KEY).cooldown - 1)
        assert breaker.admit_sync(KEY, probe_lease=LEASE).verdict is Verdict.DENY
        clock.advance(1)
        probe = breaker.admit_sync(KEY, probe_lease=LEASE)
        assert probe.verdict is Verdict.PROBE
        breaker.record_failure_sync(probe, cooldown=60)
        cooldowns.append(breaker.snapshot(KEY).cooldown)

    assert cooldowns == [120, 240, 480, 600, 600, 600]


def test_a_successful_probe_closes_it_and_resets_the_cooldown(
    store: BreakerStore, clock: FakeClock
):
    breaker = CircuitBreaker(store, now=clock.now)
    breaker.record_failure_sync(breaker.admit_sync(KEY, probe_lease=LEASE), cooldown=60)
    clock.advance(60)
    breaker.record_failure_sync(breaker.admit_sync(KEY, probe_lease=LEASE), cooldown=60)
    clock.advance(120)

    probe = breaker.admit_sync(KEY, probe_lease=LEASE)
    breaker.record_success_sync(probe, cooldown=60)

    snapshot = breaker.snapshot(KEY)
    assert (snapshot.state, snapshot.cooldown, snapshot.failures) == (BreakerState.CLOSED, 60, 0)
    assert breaker.admit_sync(KEY, probe_lease=LEASE).verdict is Verdict.ALLOW
    breaker.record_failure_sync(breaker.admit_sync(KEY, probe_lease=LEASE), cooldown=60)
    assert breaker.snapshot(KEY).cooldown == 60  # a new outage starts from the base again


def test_a_vanished_probe_is_taken_over_after_its_lease(store: BreakerStore, clock: FakeClock):
    breaker = CircuitBreaker(store, now=clock.now)
    breaker.record_failure_sync(breaker.admit_sync(KEY, probe_lease=LEASE), cooldown=60)
    clock.advance(60)
    lost = breaker.admit_sync(KEY, probe_lease=LEASE)
    assert breaker.admit_sync(KEY, probe_lease=LEASE).verdict is Verdict.DENY

    clock.advance(LEASE)
    takeover = breaker.admit_sync(KEY, probe_lease=LEASE)
    breaker.record_failure_sync(lost, cooldown=60)  # the old holder reports late: ignored

    assert (lost.verdict, takeover.verdict) == (Verdict.PROBE, Verdict.PROBE)
    assert breaker.snapshot(KEY).state is BreakerState.HALF_OPEN
    breaker.record_success_sync(takeover, cooldown=60)
    assert breaker.snapshot(KEY).state is BreakerState.CLOSED


def test_exactly_one_probe_among_threads(store: BreakerStore, clock: FakeClock):
    breaker = CircuitBreaker(store, now=clock.now)
    breaker.record_failure_sync(breaker.admit_sync(KEY, probe_lease=LEASE), cooldown=60)
    clock.advance(61)
    contenders = 8
    start = threading.Barrier(contenders)

    def contend(_: int) -> Verdict:
        try:
            start.wait()
            return breaker.admit_sync(KEY, probe_lease=LEASE).verdict
        finally:
            connections.close_all()  # each thread opened its own database connection

    with ThreadPoolExecutor(contenders) as pool:
        verdicts = list(pool.map(contend, range(contenders)))

    assert verdicts.count(Verdict.PROBE) == 1
    assert verdicts.count(Verdict.DENY) == contenders - 1


@pytest.mark.anyio
async def test_exactly_one_probe_among_concurrent_tasks(store: BreakerStore, clock: FakeClock):
    breaker = CircuitBreaker(store, now=clock.now)
    await breaker.record_failure(await breaker.admit(KEY, probe_lease=LEASE), cooldown=60)
    clock.advance(61)

    admissions = await asyncio.gather(*(breaker.admit(KEY, probe_lease=LEASE) for _ in range(40)))

    verdicts = [admission.verdict for admission in admissions]
    assert verdicts.count(Verdict.PROBE) == 1
    assert (await read(breaker)).state is BreakerState.HALF_OPEN


# --- the breaker inside the client ---------------------------------------------------------------


@pytest.mark.anyio
async def test_an_open_breaker_sends_calls_straight_to_failover(
    store: BreakerStore, clock: FakeClock, make_model_server: Callable[[], ModelServer]
):
    primary, backup = make_model_server(), make_model_server()
    primary.always(Error(500))
    backup.always(Completion(content="backup"))
    config = endpoint(primary, max_retries=2, failover=(endpoint(backup, "backup"),))
    breaker = CircuitBreaker(store, now=clock.now)
    model = OpenAICompatibleClient(config, breaker=breaker, retry=FAST)

    first = await model.complete(ASK)
    clock.advance(30)
    second = await model.complete(ASK)

    assert (first.endpoint, second.endpoint) == ("backup", "backup")
    assert len(primary.requests) == 3  # 1 + 2 retries, then the breaker skipped it
    assert (await read(breaker)).state is BreakerState.OPEN


@pytest.mark.anyio
async def test_an_open_breaker_without_failover_fails_fast_and_retryably(
    store: BreakerStore, clock: FakeClock, model_server: ModelServer
):
    model_server.always(Error(503))
    breaker = CircuitBreaker(store, now=clock.now)
    model = OpenAICompatibleClient(
        endpoint(model_server, max_retries=1), breaker=breaker, retry=FAST
    )
    with pytest.raises(ModelCallFailed):
        await model.complete(ASK)

    with pytest.raises(ModelCallFailed) as skipped:
        await model.complete(ASK)

    assert "circuit open" in str(skipped.value)
    assert skipped.value.retryable is True
    assert len(model_server.requests) == 2


@pytest.mark.anyio
async def test_only_one_concurrent_call_probes_a_recovering_endpoint(
    store: BreakerStore, clock: FakeClock, make_model_server: Callable[[], ModelServer]
):
    primary, backup = make_model_server(), make_model_server()
    primary.always(Delay(0.2, Completion(content="primary")))
    backup.always(Completion(content="backup"))
    breaker = CircuitBreaker(store, now=clock.now)
    config = endpoint(primary, failover=(endpoint(backup, "backup"),))
    await breaker.record_failure(
        await breaker.admit(config.breaker_key, probe_lease=LEASE), cooldown=60
    )
    clock.advance(60)
    model = OpenAICompatibleClient(config, breaker=breaker, retry=FAST)

    responses = await asyncio.gather(*(model.complete(ASK) for _ in range(12)))

    assert len(primary.requests) == 1
    assert sorted(r.endpoint for r in responses) == ["backup"] * 11 + ["primary"]
    assert (await read(breaker)).state is BreakerState.CLOSED


@pytest.mark.anyio
async def test_a_probe_is_a_single_attempt_without_retries(
    store: BreakerStore, clock: FakeClock, model_server: ModelServer
):
    model_server.always(Error(500))
    breaker = CircuitBreaker(store, now=clock.now)
    model = OpenAICompatibleClient(
        endpoint(model_server, max_retries=3), breaker=breaker, retry=FAST
    )
    with pytest.raises(ModelCallFailed):
        await model.complete(ASK)
    clock.advance(60)

    with pytest.raises(ModelCallFailed):
        await model.complete(ASK)

    assert len(model_server.requests) == 4 + 1
    assert (await read(breaker)).cooldown == 120


@pytest.mark.anyio
async def test_p5_an_endpoint_that_is_down_for_a_while_recovers_through_the_breaker(
    store: BreakerStore, clock: FakeClock, make_model_server: Callable[[], ModelServer]
):
    """docs/reliability.md P5: down for five minutes, then back. Calls every 10 s for 15 minutes."""
    primary, backup = make_model_server(), make_model_server()
    back_at = clock.now() + 300
    seen_at: list[float] = []

    def flaky(request: RecordedRequest) -> Error | Completion:
        seen_at.append(clock.now())
        return Error(500) if clock.now() < back_at else Completion(content="primary")

    primary.always(flaky)
    backup.always(Completion(content="backup"))
    breaker = CircuitBreaker(store, now=clock.now)
    config = endpoint(primary, max_retries=3, failover=(endpoint(backup, "backup"),))
    model = OpenAICompatibleClient(config, breaker=breaker, retry=FAST)
    answered: list[tuple[float, str]] = []

    for _ in range(90):
        answered.append((clock.now(), (await model.complete(ASK)).endpoint))
        clock.advance(10)

    start = back_at - 300
    assert len(answered) == 90  # every call was answered (by the backup while primary was down)
    assert seen_at[:4] == [start] * 4  # one exhausted call (1 + 3 retries) opened the breaker
    probes = seen_at[4 : seen_at.index(min(t for t in seen_at if t >= back_at))]
    gaps = [later - earlier for earlier, later in zip([start, *probes], probes, strict=False)]
    assert len(set(probes)) == len(probes)  # at most one probe per cooldown ...
    assert all(gap >= 60 for gap in gaps)  # ... and never more often than the cooldown
    recovered_at = min(t for t in seen_at if t >= back_at)
    assert recovered_at - back_at <= 240  # the next probe after recovery found it
    after = [endpoint for at, endpoint in answered if at >= recovered_at]
    assert after and set(after) == {"primary"}
    assert (await read(breaker)).state is BreakerState.CLOSED


@pytest.mark.anyio
async def test_an_unreachable_breaker_store_does_not_stop_model_calls(
    model_server: ModelServer, caplog: pytest.LogCaptureFixture
):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = redis.Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=0.5)
    model_server.queue(Error(500), Completion(content="ok"))
    breaker = CircuitBreaker(RedisBreakerStore(client))
    config = endpoint(model_server, max_retries=0)
    model = OpenAICompatibleClient(config, breaker=breaker, retry=FAST)

    with pytest.raises(ModelCallFailed):
        await model.complete(ASK)
    response = await model.complete(ASK)

    assert response.content == "ok"
    assert "breaker store unavailable" in caplog.text
    client.close()


# --- the production breaker's short trust in a closed read ---------------------------------------


@pytest.mark.anyio
async def test_a_closed_read_is_trusted_briefly_and_any_failure_seen_here_forgets_it(
    store: BreakerStore, clock: FakeClock
):
    reads: list[str] = []
    real_read = store.read

    def counted(key: str) -> BreakerSnapshot:
        reads.append(key)
        return real_read(key)

    store.read = counted  # type: ignore[method-assign]
    breaker = CircuitBreaker(store, now=clock.now, closed_cache_seconds=0.3)
    first = await breaker.admit(KEY, probe_lease=LEASE)
    again = await breaker.admit(KEY, probe_lease=LEASE)
    assert first.verdict is again.verdict is Verdict.ALLOW
    assert len(reads) == 1  # the second admission did not ask the store

    # Opened by another process: this one learns it once the trust has run out.
    other = CircuitBreaker(store, now=clock.now)
    await store.run(
        lambda: other.record_failure_sync(other.admit_sync(KEY, probe_lease=LEASE), cooldown=60)
    )
    assert (await breaker.admit(KEY, probe_lease=LEASE)).verdict is Verdict.ALLOW  # trusted
    await asyncio.sleep(0.35)
    assert (await breaker.admit(KEY, probe_lease=LEASE)).verdict is Verdict.DENY

    # A failure this process sees is never papered over by the trusted read.
    await store.run(lambda: store.clear(KEY))  # type: ignore[attr-defined]  (operators' reset)
    closed = await breaker.admit(KEY, probe_lease=LEASE)
    assert closed.verdict is Verdict.ALLOW
    opened = await breaker.count_failure(closed, cooldown=60)
    for _ in range(10):
        if opened:
            break
        opened = await breaker.count_failure(closed, cooldown=60)
    assert opened
    assert (await breaker.admit(KEY, probe_lease=LEASE)).verdict is Verdict.DENY


def _counted_reads(store: BreakerStore, hold: threading.Event | None = None) -> list[str]:
    """The keys ``store.read`` is asked for from now on; while ``hold`` is clear a read waits."""
    reads: list[str] = []
    real_read = store.read

    def counted(key: str) -> BreakerSnapshot:
        reads.append(key)
        if hold is not None:
            assert hold.wait(timeout=10)
        return real_read(key)

    store.read = counted  # type: ignore[method-assign]
    return reads


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition did not come true in 5 s")


@pytest.mark.anyio
async def test_a_success_late_in_the_trust_renews_it_from_a_read_in_the_background(
    store: BreakerStore, clock: FakeClock
):
    reads = _counted_reads(store)
    breaker = CircuitBreaker(store, now=clock.now, closed_cache_seconds=0.3)
    await breaker.record_success(await breaker.admit(KEY, probe_lease=LEASE), cooldown=60)
    assert len(reads) == 1  # early in the trust: nothing more to read
    await asyncio.sleep(0.2)  # less than half of it left now
    await breaker.record_success(await breaker.admit(KEY, probe_lease=LEASE), cooldown=60)
    await _until(lambda: len(reads) == 2)  # read again, in the background
    await asyncio.sleep(0.2)  # past the first read's window, within the second's
    assert (await breaker.admit(KEY, probe_lease=LEASE)).verdict is Verdict.ALLOW
    assert len(reads) == 2
    # The renewed trust rests on its own read: a breaker opened elsewhere is seen after it.
    other = CircuitBreaker(store, now=clock.now)
    await store.run(
        lambda: other.record_failure_sync(other.admit_sync(KEY, probe_lease=LEASE), cooldown=60)
    )
    await asyncio.sleep(0.35)
    assert (await breaker.admit(KEY, probe_lease=LEASE)).verdict is Verdict.DENY


@pytest.mark.anyio
async def test_a_failure_seen_while_the_trust_is_renewed_is_not_papered_over(
    store: BreakerStore, clock: FakeClock
):
    hold = threading.Event()
    hold.set()
    reads = _counted_reads(store, hold)
    breaker = CircuitBreaker(store, now=clock.now, closed_cache_seconds=0.3)
    admitted = await breaker.admit(KEY, probe_lease=LEASE)
    await asyncio.sleep(0.2)
    hold.clear()  # the background read now waits
    await breaker.record_success(admitted, cooldown=60)
    await _until(lambda: len(reads) == 2)
    # Seen here while it reads (the count itself may queue behind the read on the store).
    counting = asyncio.ensure_future(breaker.count_failure(admitted, cooldown=60))
    await asyncio.sleep(0)
    hold.set()
    await counting
    await _until(lambda: not breaker._refreshing)
    await breaker.admit(KEY, probe_lease=LEASE)
    assert len(reads) == 3  # the read that began before the failure was not trusted


@pytest.mark.anyio
async def test_without_the_setting_every_admission_asks_the_store(
    store: BreakerStore, clock: FakeClock
):
    breaker = CircuitBreaker(store, now=clock.now)
    assert (await breaker.admit(KEY, probe_lease=LEASE)).verdict is Verdict.ALLOW
    other = CircuitBreaker(store, now=clock.now)
    await store.run(
        lambda: other.record_failure_sync(other.admit_sync(KEY, probe_lease=LEASE), cooldown=60)
    )
    assert (await breaker.admit(KEY, probe_lease=LEASE)).verdict is Verdict.DENY

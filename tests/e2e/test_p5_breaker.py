"""docs/reliability.md P5: the model provider is down for a while (500s and timeouts), then back.

Real parts: a ``celery worker`` with the production AgentInvoker, ``celery beat``, the
loopback OpenAI-compatible server and the shared breaker store (Redis when ``REDIS_URL`` is set,
the database otherwise), read from this process while the runs go on.

Scaled for CI: the outage lasts 8 s (catalogue: 60 s) and the endpoint's cooldown is 2 s
(catalogue: 30 s); the endpoint allows 5 retries, so one call alone could fail 6 times and
three runs call at once. Pass criteria:

- the breaker opens after <= 5 failed requests (as the workers saw them fail);
- while it is open, at most one request per cooldown reaches the provider (the probe), and a
  probe only starts once the cooldown of the episode before it has passed;
- the runs park (``run.retry_later``) instead of failing, and all complete after recovery;
- the breaker is closed again after the first successful probe.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loops.models import LoopEvent, LoopRun, RunStatus
from loops.services.runs import run_trigger
from orchestrator.agents.clients import breaker_default
from orchestrator.agents.services import employee_create, model_endpoint_create
from runtime.breaker import BreakerSnapshot, BreakerState
from tests.e2e.conftest import start_beat, start_worker
from tests.support.approvals import LEADER, MAKER, VERIFIER, approval_pattern, http_reply
from tests.support.chaos import log_tails
from tests.support.model_server import Delay, Error, ModelServer, RecordedRequest
from tests.support.workers import WorkerProcess, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
    pytest.mark.timeout(600),
]
AGENT = {"LOOPWRIGHT_INVOKER": "loops.worker.invoker.AgentInvoker"}
ENDPOINT = "p5-loopback"
KEY = f"model-endpoint:{ENDPOINT}"
OUTAGE_SECONDS = 10.0
COOLDOWN = 2
CLIENT_TIMEOUT = 1
RUNS = 3
WAIT = 300
#: How long a provider's answer may take to reach its worker and be counted, on a busy machine.
ANSWER_IN_FLIGHT_SECONDS = 0.1


@dataclass(frozen=True)
class Hit:
    at: float  # time.time(), comparable with the breaker's epoch timestamps
    ok: bool
    #: When the client saw the failure: at once for a 500, at its timeout for a delay.
    failed_at: float | None = None


class FlakyProvider:
    """Down (500, then a timeout, alternately) from the first request for OUTAGE_SECONDS."""

    def __init__(self) -> None:
        self.hits: list[Hit] = []
        self.down_since: float | None = None
        self.lock = threading.Lock()

    @property
    def down_until(self) -> float:
        return (self.down_since or 0.0) + OUTAGE_SECONDS

    def __call__(self, request: RecordedRequest) -> Any:
        now = time.time()
        with self.lock:
            if self.down_since is None:
                self.down_since = now
            down = now < self.down_until
            failures = sum(1 for h in self.hits if not h.ok) + 1
            if not down:
                self.hits.append(Hit(now, True))
            elif failures % 2:
                self.hits.append(Hit(now, False, now))
            else:
                self.hits.append(Hit(now, False, now + CLIENT_TIMEOUT - 0.05))
        if not down:
            return http_reply(request)
        if failures % 2:
            return Error(500, {"error": {"message": "upstream exploded"}})
        return Delay(CLIENT_TIMEOUT * 3, Error(500, {"error": {"message": "too late"}}))


class BreakerWatch:
    """Polls the shared breaker state and keeps every distinct snapshot it saw, timestamped."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, BreakerSnapshot]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        breaker = breaker_default()
        while not self.stop.is_set():
            snapshot = breaker.snapshot(KEY)
            if not self.seen or _episode(self.seen[-1][1]) != _episode(snapshot):
                self.seen.append((time.time(), snapshot))
            time.sleep(0.02)

    def states(self) -> list[BreakerSnapshot]:
        return [s for _, s in self.seen]


def _episode(s: BreakerSnapshot) -> tuple[Any, ...]:
    return (s.state, s.opened_at, s.cooldown, s.probe_owner)


@pytest.fixture
def provider() -> FlakyProvider:
    return FlakyProvider()


@pytest.fixture
def model(provider: FlakyProvider) -> Iterator[ModelServer]:
    with ModelServer() as server:
        server.always(provider)
        yield server


@pytest.fixture
def watch() -> Iterator[BreakerWatch]:
    watching = BreakerWatch()
    yield watching
    watching.stop.set()
    watching.thread.join()


@pytest.fixture
def pattern(model: ModelServer) -> Any:
    endpoint = model_endpoint_create(
        name=ENDPOINT,
        provider="openai",
        base_url=model.url,
        model="p5-script",
        # Each call alone could fail 6 times: the shared threshold is what opens the breaker.
        max_retries=5,
        timeout_seconds=CLIENT_TIMEOUT,
        circuit_cooldown_seconds=COOLDOWN,
    )
    for username in (LEADER, MAKER, VERIFIER):
        employee_create(username=username, endpoint=endpoint, tools=["read", "list"])
    return approval_pattern("p5-breaker")


def test_an_outage_opens_the_breaker_probes_sparingly_and_the_runs_complete_after_it(
    tmp_path: Path,
    workers: list[WorkerProcess],
    procs: list[Any],
    provider: FlakyProvider,
    watch: BreakerWatch,
    pattern: Any,
) -> None:
    assert breaker_default().snapshot(KEY).state is BreakerState.CLOSED
    start_beat(procs, tmp_path, 1.0)
    start_worker(workers, tmp_path, "p5", **AGENT)
    watch.thread.start()
    run_ids = [
        run_trigger(pattern=pattern, actor="operator", inputs={"label": str(i)}).id
        for i in range(RUNS)
    ]
    wait_for(
        lambda: (
            LoopRun.objects.filter(id__in=run_ids, status=RunStatus.SUCCEEDED).count() == RUNS
            or LoopRun.objects.filter(id__in=run_ids, status=RunStatus.FAILED).exists()
        ),
        timeout=WAIT,
        interval=0.5,
        message=log_tails([*workers, *procs]),
    )
    time.sleep(0.2)  # one more poll of the breaker
    watch.stop.set()
    watch.thread.join()

    statuses = list(LoopRun.objects.filter(id__in=run_ids).values_list("status", flat=True))
    assert statuses == [RunStatus.SUCCEEDED] * RUNS, (statuses, log_tails(workers))
    parked = LoopEvent.objects.filter(run_id__in=run_ids, type="run.retry_later").count()
    assert parked >= 1  # the outage parked runs; none failed

    opened = [(at, s) for at, s in watch.seen if s.state is BreakerState.OPEN]
    assert opened, [s.state for s in watch.states()]
    first_open = min(s.opened_at or at for at, s in opened)
    # Failures the workers had seen when it opened: a request already on the wire then fails
    # after the trip, and is not one of the failures that opened it; nor is a failure the
    # provider answered moments before the trip, whose answer had not reached its worker yet
    # (three runs call at once: the answer and the worker's count are not one instant).
    failed_before = [
        h
        for h in provider.hits
        if h.failed_at is not None and h.failed_at < first_open - ANSWER_IN_FLIGHT_SECONDS
    ]
    assert 1 <= len(failed_before) <= 5, (first_open, provider.hits)

    # While open, only probes reach the provider: each one starts no earlier than the cooldown
    # of the episode before it, and never two in one cooldown window.
    episodes = [s for s in watch.states() if s.state is not BreakerState.CLOSED]
    for before, after in itertools.pairwise(episodes):
        if before.state is BreakerState.OPEN and after.state is BreakerState.HALF_OPEN:
            assert (after.opened_at or 0) >= (before.opened_at or 0) + before.cooldown - 0.05
    # Requests that left before the trip may land just after it (at most one per caller
    # that was mid-attempt, within the client timeout); after that, one per cooldown at most.
    settled = first_open + CLIENT_TIMEOUT + 0.5
    during = [h.at for h in provider.hits if settled <= h.at < provider.down_until]
    windows = int((provider.down_until - settled) // COOLDOWN) + 1
    assert len(during) <= windows, (during, first_open)
    for earlier, later in itertools.pairwise(during):
        assert later - earlier >= COOLDOWN - 0.1, during

    # Closed again by the first successful probe, and it stayed closed.
    final = breaker_default().snapshot(KEY)
    assert final.state is BreakerState.CLOSED and final.cooldown == COOLDOWN
    # The first successful request was the probe: the breaker was not closed when it arrived
    # (only a probe's success closes it), and it was closed from then on.
    first_ok = next(h.at for h in provider.hits if h.ok)
    [state_at_recovery] = [s.state for at, s in watch.seen if at <= first_ok][-1:]
    assert state_at_recovery is not BreakerState.CLOSED, watch.seen
    after = [s.state for at, s in watch.seen if at > first_ok + 0.5]
    assert set(after) <= {BreakerState.CLOSED}, watch.seen
    print(
        f"\nP5: {len(failed_before)} failures before open; {len(during)} probes while down; "
        f"{parked} parks; {len(provider.hits)} requests"
    )

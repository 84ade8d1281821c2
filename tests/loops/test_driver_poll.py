"""The driver's poll: the safety net behind the nudges claims due runs a small batch at a time,
and a run that had to wait for a free slot is claimed as soon as one frees, not a poll
interval later (in-process driver, real database, an invoker that finishes each role at once)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from loops.models import LoopEvent, LoopRun, RunStatus
from loops.worker import driver as driver_module
from loops.worker.driver import POLL_BATCH, RunDriver
from runtime.invocation import (
    InvocationOutcome,
    InvocationRequest,
    LoopRole,
    NothingToPrepare,
    OutcomeKind,
    StepJournal,
)
from tests.support.factories import make_pattern, make_run
from tests.support.workers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

#: Far longer than any wait below: a run claimed in time was not claimed by the timed poll.
POLL_SECONDS = 30.0


class _Instant(NothingToPrepare):
    """Every role finishes at once (after ``hold`` seconds), with an output its role accepts."""

    def __init__(self, hold: float = 0.0) -> None:
        self.hold = hold

    async def invoke(
        self, request: InvocationRequest, journal: StepJournal, prepared: Any = None
    ) -> InvocationOutcome:
        await asyncio.sleep(self.hold)
        output: dict[str, Any] = {"summary": "done"}
        if request.role == LoopRole.LEADER:
            output = {"tasks": [{"title": "do it"}]}
        elif request.role == LoopRole.VERIFIER:
            output = {"verdict": "pass", "reasons": ["scripted"], "checks": []}
        return InvocationOutcome(kind=OutcomeKind.COMPLETED, output=output)


def _db_call_and_close(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    finally:
        connection.close()  # the test runner is no worker: no connections left behind


@pytest.fixture
def driver_factory(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[Any]:
    monkeypatch.setattr(driver_module, "_db_call", _db_call_and_close)
    settings.LOOPWRIGHT = {**settings.LOOPWRIGHT, "POLL_INTERVAL_SECONDS": POLL_SECONDS}
    started: list[RunDriver] = []

    def build(*, capacity: int, hold: float = 0.0) -> RunDriver:
        driver = RunDriver(
            invoker=_Instant(hold), capacity=capacity, owner=f"test-{uuid.uuid4().hex[:6]}"
        )
        started.append(driver)
        return driver

    yield build
    for driver in started:
        driver.stop(drain_seconds=5)
        if not driver.loop.is_closed():
            driver.loop.close()


def _finished(runs: list[LoopRun]) -> int:
    return LoopRun.objects.filter(id__in=[r.id for r in runs], status=RunStatus.SUCCEEDED).count()


def test_runs_waiting_for_a_slot_are_claimed_as_slots_free_without_nudges(
    driver_factory: Any,
) -> None:
    """More runs are due than the driver holds and no nudge comes: the first poll fills the
    driver, and each finished run frees a slot that the next poll takes at once."""
    pattern = make_pattern()
    runs = [make_run(pattern) for _ in range(POLL_BATCH + 5)]
    driver = driver_factory(capacity=3)
    started = time.monotonic()
    driver.start()
    wait_for(lambda: _finished(runs) == len(runs), timeout=POLL_SECONDS / 2)
    assert time.monotonic() - started < POLL_SECONDS / 2
    claims = LoopEvent.objects.filter(run__in=runs, type="lease.claimed").count()
    assert claims == len(runs), "each run claimed exactly once"


def test_a_nudge_turned_away_by_a_full_driver_is_claimed_when_a_slot_frees(
    driver_factory: Any,
) -> None:
    """The driver is full when a run's nudge arrives; the run is claimed as soon as the run
    holding the slot ends, not at the next timed poll."""
    driver = driver_factory(capacity=1, hold=0.5)
    driver.start()
    time.sleep(0.2)  # the first poll found nothing: from now on, only nudges bring work
    pattern = make_pattern()
    first = make_run(pattern)
    driver.submit(first.id)
    wait_for(lambda: first.id in driver.tasks, timeout=5)
    second = make_run(pattern)
    driver.submit(second.id)  # turned away: no free slot
    wait_for(lambda: _finished([first, second]) == 2, timeout=POLL_SECONDS / 3)


def test_a_driver_that_finishes_runs_does_not_grab_runs_nobody_announced(
    driver_factory: Any,
) -> None:
    """Nothing was turned away and the last poll found the queue empty: a finished run does
    not trigger a claim, so runs queued meanwhile go to whichever worker their nudge reaches
    (here: none, so they wait for the timed poll)."""
    driver = driver_factory(capacity=5)
    driver.start()
    time.sleep(0.2)  # the first poll found nothing
    pattern = make_pattern()
    nudged = make_run(pattern)
    driver.submit(nudged.id)
    unannounced = make_run(pattern)
    wait_for(lambda: _finished([nudged]) == 1, timeout=10)
    time.sleep(0.5)
    unannounced.refresh_from_db()
    assert unannounced.status == RunStatus.QUEUED


def test_a_burst_of_nudges_is_claimed_together_not_one_claim_each(
    driver_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nudges that arrive while a claim of nudged runs is in flight wait for it and are then
    claimed in one claim: a burst of triggers costs a few claims, each run claimed once."""
    nudge_claims: list[list[uuid.UUID]] = []
    real_claim = driver_module.run_claim

    def recorded(**kwargs: Any) -> Any:
        if kwargs.get("run_ids") is not None:
            nudge_claims.append(list(kwargs["run_ids"]))
            if len(nudge_claims) == 1:
                time.sleep(0.3)  # a slow first claim: the rest of the burst arrives meanwhile
        return real_claim(**kwargs)

    monkeypatch.setattr(driver_module, "run_claim", recorded)
    driver = driver_factory(capacity=20)
    driver.start()
    time.sleep(0.2)  # the first poll found nothing
    pattern = make_pattern()
    runs = [make_run(pattern) for _ in range(12)]
    for run in runs:
        driver.submit(run.id)
        driver.submit(run.id)  # a duplicate nudge changes nothing
    wait_for(lambda: _finished(runs) == len(runs), timeout=POLL_SECONDS / 3)
    assert len(nudge_claims) <= 3, nudge_claims
    assert sorted(map(str, (i for ids in nudge_claims for i in ids))) == sorted(
        str(r.id) for r in runs
    )
    claims = LoopEvent.objects.filter(run__in=runs, type="lease.claimed").count()
    assert claims == len(runs), "each run claimed exactly once"


def test_the_claims_benchmark_claims_in_the_batches_a_driver_poll_takes() -> None:
    from bench.claims import POLL_BATCH as BENCH_BATCH

    assert BENCH_BATCH == POLL_BATCH

"""A run whose lease is taken away while its maker works is counted as a lease loss: the real
RunDriver in this process, its heartbeat finding the lease gone."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from django.db import connection

from loops.models import LoopRun
from loops.worker import driver as driver_module
from loops.worker.driver import RunDriver
from runtime.invocation import (
    InvocationOutcome,
    InvocationRequest,
    LoopRole,
    NothingToPrepare,
    OutcomeKind,
    StepJournal,
)
from tests.observability.scrape import moved, web_scrape
from tests.support.factories import make_run
from tests.support.workers import wait_for


class _BusyMaker(NothingToPrepare):
    """The leader plans at once; the maker works until it is cancelled."""

    def __init__(self) -> None:
        self.working = threading.Event()

    async def invoke(
        self, request: InvocationRequest, journal: StepJournal, prepared: Any = None
    ) -> InvocationOutcome:
        if request.role == LoopRole.LEADER:
            return InvocationOutcome(kind=OutcomeKind.COMPLETED, output={"tasks": [{"title": "x"}]})
        self.working.set()
        await asyncio.sleep(120)
        raise AssertionError("the maker outlived its lease")


def _db_call_and_close(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    finally:
        connection.close()  # the test runner is no worker: no connections left behind


@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_a_lease_taken_away_while_the_maker_works_counts_as_a_lease_loss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(driver_module, "_db_call", _db_call_and_close)
    run = make_run()
    invoker = _BusyMaker()
    driver = RunDriver(invoker=invoker, capacity=2, owner="metrics-driver")
    driver.start()
    try:
        before = web_scrape()
        driver.submit(run.id)
        assert invoker.working.wait(timeout=60), "the maker never started"
        LoopRun.objects.filter(pk=run.pk).update(lease_owner="another-worker")
        beat = asyncio.run_coroutine_threadsafe(driver.heartbeat_once(), driver.loop)
        beat.result(timeout=30)
        wait_for(lambda: run.id not in driver.tasks, timeout=30, message="the run went on")
        after = web_scrape()
    finally:
        driver.stop(drain_seconds=1)
    assert moved(before, after, "loopwright_lease_losses_total", where="heartbeat") == 1

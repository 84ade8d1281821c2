"""The run driver: one asyncio loop per worker process that holds many runs at once.

A run spends nearly all its life waiting on a model or a tool, so a run is a coroutine, not an
OS process: one driver holds up to ``capacity`` runs. Database work runs on a small thread pool
(each thread keeps its own Django connection), so the event loop never blocks on SQL and the
number of database connections stays bounded whatever the number of runs.

Work arrives three ways, all idempotent: a Celery nudge naming a run, a poll of the database
for due runs, and a wake-up after one of our own runs finished. Whichever way, the claim in the
database decides; a duplicate nudge finds the run already leased and does nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection
from django.utils.module_loading import import_string

from loops.services.claims import Claimed, run_claim, run_heartbeat
from loops.services.claims_failures import describe_error, run_driver_error
from loops.services.runs import runs_release_owner
from loops.services.transitions import Lease
from loops.worker.engine import drive_run, with_resume_steps
from orchestrator.logcontext import RUN_ID
from orchestrator.metrics import LEASE_LOSSES
from runtime.invocation import LeaseLost, RoleInvoker
from runtime.model_pool import close_http_pool, pool_http_connections

logger = logging.getLogger(__name__)
T = TypeVar("T")
#: Runs a poll claims at once (nudges bring the bulk of the work, spread over the workers).
POLL_BATCH = 10
#: An event loop slower than this to come back is busy: its driver leaves work to its peers.
BUSY_LOOP_SECONDS = 0.005


def _owner_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def load_invoker() -> RoleInvoker:
    """The configured invoker (``LOOPWRIGHT_INVOKER``): a class path, built without arguments."""
    factory = import_string(settings.LOOPWRIGHT["INVOKER"])
    built: RoleInvoker = factory.build() if hasattr(factory, "build") else factory()
    return built


class RunDriver:
    """Drives claimed runs concurrently; see the module docstring."""

    def __init__(
        self,
        *,
        invoker: RoleInvoker | None = None,
        capacity: int | None = None,
        owner: str | None = None,
    ) -> None:
        conf = settings.LOOPWRIGHT
        self.owner = owner or _owner_name()
        self.capacity = capacity or int(conf["DRIVER_CAPACITY"])
        self.lease_seconds = float(conf["LEASE_SECONDS"])
        self.heartbeat_seconds = float(conf["HEARTBEAT_SECONDS"])
        self.poll_seconds = float(conf["POLL_INTERVAL_SECONDS"])
        self.invoker = invoker or load_invoker()
        self.db_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=int(conf["DRIVER_DB_THREADS"]), thread_name_prefix="lw-db"
        )
        #: The heartbeat's own thread (and connection): it never queues behind the runs' writes,
        #: which under load (a drain of many runs, a busy host) would outlast the lease.
        self.heartbeat_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="lw-heartbeat"
        )
        self.loop = asyncio.new_event_loop()
        self.tasks: dict[uuid.UUID, asyncio.Task[None]] = {}
        self._claiming: set[asyncio.Future[int]] = set()
        #: Nudged runs waiting for their claim (in order), and the claim of them in flight.
        self._nudged: dict[uuid.UUID, None] = {}
        self._nudge_claims: asyncio.Future[int] | None = None
        self._nudged_claiming: set[uuid.UUID] = set()
        #: Work may be waiting for a slot (a nudge found the driver full, or a poll filled
        #: it): claim by poll as soon as a run ends.
        self._work_waiting = False
        self.accepting = True
        self._wake: asyncio.Event | None = None
        self._stopped: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle (called from other threads) ---------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run_loop, name="lw-driver", daemon=True)
        self._thread.start()

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())

    def submit(self, run_id: uuid.UUID) -> None:
        """A nudge: try to claim this run now (thread-safe, returns at once)."""
        self.loop.call_soon_threadsafe(self._on_nudge, run_id)

    def stop(self, drain_seconds: float | None = None) -> None:
        """Stop claiming, let runs finish for up to ``drain_seconds``, release the rest."""
        if self._thread is None:
            return
        drain = (
            float(settings.LOOPWRIGHT["DRAIN_SECONDS"]) if drain_seconds is None else drain_seconds
        )
        future = asyncio.run_coroutine_threadsafe(self._shutdown(drain), self.loop)
        future.result(timeout=drain + 30)
        self._thread.join(timeout=10)
        self.db_pool.shutdown(wait=True)
        self.heartbeat_pool.shutdown(wait=True)
        if not self.loop.is_running():
            self.loop.close()

    # --- database access off the event loop ------------------------------------------------
    async def db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        call = functools.partial(_db_call, fn, *args, **kwargs)
        return await self.loop.run_in_executor(self.db_pool, call)

    # --- main loop --------------------------------------------------------------------------
    async def _main(self) -> None:
        # Model calls of every run share keep-alive connections (closed at the end).
        pool_http_connections(self.loop)
        self._wake = asyncio.Event()
        self._stopped = asyncio.Event()
        background = [
            asyncio.create_task(self._poll_forever(), name="lw-poll"),
            asyncio.create_task(self._heartbeat_forever(), name="lw-heartbeat"),
        ]
        await self._stopped.wait()
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await close_http_pool()

    def _free(self) -> int:
        return self.capacity - len(self.tasks)

    def _on_nudge(self, run_id: uuid.UUID) -> None:
        """A nudged run is claimed at once if no claim of nudged runs is in flight; nudges
        that arrive meanwhile are claimed together by the next one (one statement for a
        burst of triggers, not one each)."""
        if not self.accepting or run_id in self.tasks:
            return
        if run_id in self._nudged or run_id in self._nudged_claiming:
            return  # a duplicate of a nudge that waits for its claim or is being claimed
        if self._free() - len(self._nudged) - len(self._nudged_claiming) > 0:
            self._nudged[run_id] = None
            if self._nudge_claims is None:
                self._nudge_claims = asyncio.ensure_future(self._claim_nudged())
                self._claiming.add(self._nudge_claims)  # shutdown waits for it
                self._nudge_claims.add_done_callback(self._claiming.discard)
        else:
            self._work_waiting = True

    async def _claim_nudged(self) -> int:
        """Claim the nudged runs, all waiting ones in one claim, until none are left."""
        claimed = 0
        try:
            while self._nudged and self.accepting:
                waiting, free = list(self._nudged), max(0, self._free())
                self._nudged.clear()
                if len(waiting) > free:
                    self._work_waiting = True  # the poll claims the rest when slots free up
                run_ids = waiting[:free]
                if run_ids:
                    self._nudged_claiming = set(run_ids)
                    claimed += await self._claim_and_start(run_ids=run_ids, limit=len(run_ids))
        finally:
            self._nudged.clear()
            self._nudged_claiming = set()
            self._nudge_claims = None
        return claimed

    async def _claim_and_start(self, *, run_ids: list[uuid.UUID] | None = None, limit: int) -> int:
        try:
            claims = await self.db(
                _claim_and_read,
                owner=self.owner,
                lease_seconds=self.lease_seconds,
                limit=limit,
                run_ids=run_ids,
            )
        except (OperationalError, InterfaceError) as exc:
            logger.warning("claim failed, database unavailable: %s", type(exc).__name__)
            return 0
        for claim in claims:
            self._start(claim)
        return len(claims)

    def _start(self, claim: Claimed) -> None:
        run_id = claim.lease.run_id
        if run_id in self.tasks or not self.accepting:
            return  # cannot happen with a fresh token, but never drive a run twice
        task = asyncio.create_task(self._drive(claim), name=f"run-{run_id}")
        self.tasks[run_id] = task

    async def _drive(self, claim: Claimed) -> None:
        run_id = claim.lease.run_id
        RUN_ID.set(str(run_id))  # this task's log lines name the run (LOG_FORMAT=json)
        try:
            await drive_run(self, claim)
        except LeaseLost:
            LEASE_LOSSES.labels(where="driving").inc()
            logger.info("run %s: lease lost, another worker or a human took it", run_id)
        except asyncio.CancelledError:
            logger.info("run %s: driving cancelled", run_id)
        except (OperationalError, InterfaceError) as exc:
            # The lease will expire and the reaper re-queues the run: nothing is lost.
            logger.warning(
                "run %s: database unavailable (%s); leaving it to the reaper",
                run_id,
                type(exc).__name__,
            )
        except Exception as exc:
            logger.exception("run %s: driver error", run_id)
            await self._record_error(claim, exc)
        finally:
            self.tasks.pop(run_id, None)
            # A freed slot is claimed at once only if work may be waiting for one: otherwise
            # the nudges, which the broker spreads over the workers, bring the work, and a
            # driver finishing runs does not grab a batch its peers would share.
            if self._work_waiting and self._wake is not None:
                self._work_waiting = False
                self._wake.set()

    async def _record_error(self, claim: Claimed, exc: Exception) -> None:
        """Write the error to the run (an event, and a retry or a failure naming it), so it
        never lives only in this log; if that write fails the lease expires and the reaper
        counts the attempt as a death."""
        run_id = claim.lease.run_id
        try:
            status = await self.db(run_driver_error, claim.lease, describe_error(exc))
        except LeaseLost:
            logger.info("run %s: lease lost before its driver error was recorded", run_id)
        except Exception:
            logger.exception("run %s: the driver error could not be recorded", run_id)
        else:
            logger.info("run %s: driver error recorded; the run is %s", run_id, status)

    async def _poll_forever(self) -> None:
        """The safety net behind the nudges: claim what is due and nobody took (a lost
        message, a run that waited for a slot), a small batch at a time. A full batch is
        followed at once by another while this driver keeps up (its event loop answers
        promptly), else after the poll interval, leaving the rest to its peers."""
        assert self._wake is not None
        while True:
            claimed, batch = 0, min(self._free(), POLL_BATCH)
            if self.accepting and batch > 0:
                # Tracked like a nudge's claim, so shutdown waits for it before releasing.
                claim = asyncio.ensure_future(self._claim_and_start(limit=batch))
                self._claiming.add(claim)
                claim.add_done_callback(self._claiming.discard)
                claimed = await asyncio.shield(claim)
            if self.accepting and claimed == batch:
                # A full batch (or no free slot): more runs may be due than were claimed.
                self._work_waiting = True
                if batch > 0 and await self._keeping_up():
                    continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.poll_seconds)
            self._wake.clear()

    async def _keeping_up(self) -> bool:
        """Does the event loop come back to us promptly (few callbacks queued ahead)?"""
        started = self.loop.time()
        await asyncio.sleep(0)
        return self.loop.time() - started < BUSY_LOOP_SECONDS

    async def _heartbeat_forever(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_seconds)
            await self.heartbeat_once()

    async def heartbeat_once(self) -> None:
        held_ids = list(self.tasks)
        if not held_ids:
            return
        try:
            beat = functools.partial(
                _db_call,
                run_heartbeat,
                owner=self.owner,
                run_ids=held_ids,
                lease_seconds=self.lease_seconds,
            )
            still = await self.loop.run_in_executor(self.heartbeat_pool, beat)
        except (OperationalError, InterfaceError) as exc:
            logger.warning("heartbeat failed, database unavailable: %s", type(exc).__name__)
            return
        for run_id in set(held_ids) - still:
            task = self.tasks.get(run_id)
            if task is not None:
                LEASE_LOSSES.labels(where="heartbeat").inc()
                # Cancelled, paused or taken over: stop the model call and the tools at once.
                logger.info("run %s: lease gone at heartbeat, cancelling its work", run_id)
                task.cancel()

    async def _shutdown(self, drain_seconds: float) -> None:
        self.accepting = False
        # A claim in flight would otherwise commit after the release below and leak its run.
        await asyncio.gather(*list(self._claiming), return_exceptions=True)
        pending = list(self.tasks.values())
        if pending:
            logger.info("draining %d run(s) for up to %.0f s", len(pending), drain_seconds)
            _, still = await asyncio.wait(pending, timeout=drain_seconds)
            leases = [t for t in still]
            for task in leases:
                task.cancel()
            await asyncio.gather(*leases, return_exceptions=True)
        await self._release_all()
        assert self._stopped is not None
        self._stopped.set()

    async def _release_all(self) -> None:
        """Give back every lease this owner still holds (runs go back to ``queued``)."""
        try:
            released = await self.db(runs_release_owner, owner=self.owner)
        except (OperationalError, InterfaceError):
            logger.warning("could not release leases at shutdown; they will expire")
            return
        if released:
            logger.info("released %d lease(s) at shutdown", released)


def _claim_and_read(**kwargs: Any) -> list[Claimed]:
    """:func:`run_claim`, and what the engine reads at once of each run claimed
    (``engine.with_resume_steps``), in one trip to the database threads."""
    return [with_resume_steps(claim) for claim in run_claim(**kwargs)]


def _db_call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        return fn(*args, **kwargs)
    except (OperationalError, InterfaceError):
        # A broken connection (database restart): drop it so the next call reconnects.
        connection.close()
        raise


_driver: RunDriver | None = None
_driver_lock = threading.Lock()
_stopping = False


def get_driver() -> RunDriver | None:
    """The process-wide driver, started on first use; None once the process is stopping
    (a nudge delivered during warm shutdown must not start a new driver)."""
    global _driver
    with _driver_lock:
        if _stopping:
            return None
        if _driver is None:
            _driver = RunDriver()
            _driver.start()
        return _driver


def stop_driver(drain_seconds: float | None = None) -> None:
    global _driver, _stopping
    with _driver_lock:
        _stopping = True
        driver, _driver = _driver, None
    if driver is not None:
        driver.stop(drain_seconds)


__all__ = ["Lease", "RunDriver", "get_driver", "load_invoker", "stop_driver"]

"""Wake-ups for live streams: writers announce that a run changed, streams sleep until then.

Writers mark the runs a transaction touches (:func:`touched`, :func:`touched_sql` for a fence
statement, :func:`run_changed`); once that transaction commits, the process's
:class:`Announcer` sends them to PostgreSQL's ``loopwright_runs`` channel in one ``NOTIFY``
transaction of its own connection, at most one per :data:`COALESCE_SECONDS` (wake-ups arriving
meanwhile are gathered into the next). A woken stream always finds the write (nothing is
announced before its commit; a rolled-back write announces nothing), and the engine's writes
carry no ``NOTIFY``: PostgreSQL serialises the commits of transactions that notify (a global
lock held through the commit): 0.72x the commits of a bare 4-client loop on the reference
machine (``python -m bench raw_reference``; docs/performance.md).
On SQLite nothing is announced (the embedded default keeps its short poll).

One :class:`Hub` per process (a daemon thread, started by the first stream that asks) holds a
dedicated connection that ``LISTEN``\\s on the channel and wakes the waiters subscribed to the
run's topic (:func:`run_topic`) and to :data:`ANY_RUN`. While it is not listening (starting,
reconnecting after an error) streams poll; once it listens again every waiter is woken, because
notifications sent in between were lost. The listening connection is checked with ``SELECT 1``
every :data:`CHECK_SECONDS` (a connection that died quietly would otherwise look idle). Behind a
transaction pooler the hub listens on ``LOOPWRIGHT_LISTEN_DATABASE_URL`` (a direct connection),
and without one there is no hub: streams poll, as on SQLite (docs/operations.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction

from orchestrator.dbthreads import connections_warm
from orchestrator.sql import is_postgres

logger = logging.getLogger(__name__)

CHANNEL = "loopwright_runs"
#: The topic of streams that follow every run (the monitor, the approvals queue).
ANY_RUN = "runs"
#: How often the listening connection proves it is alive.
CHECK_SECONDS = 30.0
#: The longest the hub waits before reconnecting after an error.
MAX_BACKOFF_SECONDS = 5.0


def run_topic(run_id: uuid.UUID | str) -> str:
    return f"run:{run_id}"


# --- writers -----------------------------------------------------------------------------------


class _Collecting(threading.local):
    """The run ids of the raw batch open on this thread (``loops.db.batch``), or None."""

    ids: list[str] | None = None


_collecting = _Collecting()


@contextlib.contextmanager
def collected() -> Iterator[None]:
    """For a transaction Django does not see (a raw batch that sends its own ``COMMIT`` inside
    the block): the runs touched in the block are announced once it exits without an error,
    and dropped when it raises."""
    outer = _collecting.ids
    ids: list[str] = []
    _collecting.ids = ids
    try:
        yield
    finally:
        _collecting.ids = outer
    announce(ids)


def touched(run_id: uuid.UUID | str) -> bool:
    """Announce the run once the current transaction commits: the raw batch's open on this
    thread, else Django's atomic block's. False when neither is open (the caller's statement
    commits on its own: :func:`touched_sql` then notifies from inside it). True on SQLite."""
    if not is_postgres():
        return True
    if _collecting.ids is not None:
        _collecting.ids.append(str(run_id))
        return True
    if connection.in_atomic_block:
        key = str(run_id)
        transaction.on_commit(lambda: announce([key]))
        return True
    return False


def touched_sql(now: str, run_id: uuid.UUID) -> str:
    """A run row's new ``updated_at`` for the SET clause of a fence ``UPDATE`` of ``run_id``,
    which is announced when the transaction building it commits (:func:`touched`); outside one,
    ``pg_notify`` is evaluated inside the statement (for the row it writes, so a fence that
    matches nothing announces nothing)."""
    if touched(run_id):
        return now
    return f"(SELECT {now} FROM pg_notify('{CHANNEL}', CAST(loops_looprun.id AS TEXT)))"  # noqa: S608 (constants)


def run_changed(run_id: uuid.UUID) -> None:
    """The caller changed the run: announce it once its transaction commits (at once when
    the change is committed already). Nothing on SQLite."""
    runs_changed([run_id])


def runs_changed(run_ids: Sequence[uuid.UUID]) -> None:
    """:func:`run_changed` for several runs."""
    for run_id in run_ids:
        if not touched(run_id):
            announce([str(run_id)])


def announce(run_ids: Sequence[str]) -> None:
    """Send these (committed) runs' wake-ups, through this process's :class:`Announcer`."""
    if run_ids and is_postgres():
        announcer().add(run_ids)


#: The least time between two ``NOTIFY`` transactions of a process: wake-ups arriving sooner
#: are gathered into the next one (a quiet process sends at once).
COALESCE_SECONDS = 0.01
#: The announcer closes its connection after this long with nothing to send.
IDLE_CLOSE_SECONDS = 1.0
#: Wake-ups kept for a retry while the database refuses them (past it the oldest are dropped:
#: a stream then catches up at the run's next change or its reconnect).
PENDING_LIMIT = 10_000
NOTIFY_MANY_SQL = "SELECT pg_notify(%s, r) FROM unnest(%s::text[]) AS r"


class Announcer:
    """This process's sender of wake-ups: one daemon thread, one connection (Django's, of the
    thread), at most one ``NOTIFY`` transaction per :data:`COALESCE_SECONDS`."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._pending: dict[str, None] = {}  # ordered, deduplicated
        self._ready = threading.Condition()
        self._last_sent = 0.0
        self.sent = 0
        self.thread = threading.Thread(target=self._run, name="loopwright-announce", daemon=True)
        self.thread.start()

    def add(self, run_ids: Sequence[str]) -> None:
        with self._ready:
            for run_id in run_ids:
                self._pending[run_id] = None
            self._ready.notify()

    def _take(self) -> list[str] | None:
        """The pending wake-ups, at least :data:`COALESCE_SECONDS` after the last send (at
        once after a quiet spell; gathered under load); None when idle too long."""
        with self._ready:
            if not self._pending and not self._ready.wait(IDLE_CLOSE_SECONDS):
                return None
        pause = self._last_sent + COALESCE_SECONDS - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        with self._ready:
            taken, self._pending = list(self._pending), {}
        self._last_sent = time.monotonic()
        return taken

    def _run(self) -> None:
        backoff = 0.1
        while True:
            taken = self._take()
            if taken is None:
                connection.close()  # idle: no session held open between bursts
                continue
            if not taken:
                continue
            try:
                connections_warm()  # no health check per NOTIFY through a burst
                with connection.cursor() as cursor:
                    cursor.execute(NOTIFY_MANY_SQL, [CHANNEL, taken])
                self.sent += len(taken)
                backoff = 0.1
            except Exception:
                logger.warning("live stream wake-ups: could not announce; retrying", exc_info=True)
                connection.close()
                with self._ready:
                    kept = {**dict.fromkeys(taken), **self._pending}
                    self._pending = dict.fromkeys(list(kept)[-PENDING_LIMIT:])
                time.sleep(backoff)
                backoff = min(MAX_BACKOFF_SECONDS, backoff * 2)


_announcer: Announcer | None = None
_announcer_lock = threading.Lock()


def announcer() -> Announcer:
    """This process's announcer, started on first use (again in a forked child)."""
    global _announcer
    current = _announcer
    if current is not None and current.pid == os.getpid():
        return current
    with _announcer_lock:
        if _announcer is None or _announcer.pid != os.getpid():
            _announcer = Announcer()
        return _announcer


# --- waiters ------------------------------------------------------------------------------------


class Waiter:
    """One stream's wake-up flag for its topics; :meth:`wake` is called from the hub's thread.
    ``early`` waiters are woken before the others (a cache its streams read through must
    know of the change before they read)."""

    early = False

    def __init__(self, topics: frozenset[str]) -> None:
        self.topics = topics

    def wake(self) -> None:
        raise NotImplementedError


class CountingWaiter(Waiter):
    """Counts its wake-ups (``woken``), for a cache that re-reads when the count moved."""

    early = True

    def __init__(self, topics: frozenset[str]) -> None:
        super().__init__(topics)
        self.woken = 0

    def wake(self) -> None:
        self.woken += 1


class ThreadWaiter(Waiter):
    """For a stream served in its own thread (WSGI)."""

    def __init__(self, topics: frozenset[str]) -> None:
        super().__init__(topics)
        self.event = threading.Event()

    def wake(self) -> None:
        self.event.set()

    def wait(self, timeout: float) -> bool:
        """True when woken (the flag is cleared), False when ``timeout`` passed first."""
        woken = self.event.wait(max(0.0, timeout))
        self.event.clear()
        return woken


class AsyncWaiter(Waiter):
    """For a stream served on an event loop (ASGI); made on that loop. The hub wakes the
    waiters of one loop with one callback on it (:func:`wake_on_loops`), and a wait is one
    future and one timer: 500 streams of a run cost one self-pipe write, not 500 tasks."""

    def __init__(self, topics: frozenset[str]) -> None:
        super().__init__(topics)
        self.loop = asyncio.get_running_loop()
        self.woken = False
        self.future: asyncio.Future[bool] | None = None

    def wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            self.loop.call_soon_threadsafe(self.set)

    def set(self) -> None:
        """On the waiter's loop: wake its wait, or the next one."""
        future = self.future
        if future is not None and not future.done():
            future.set_result(True)
        else:
            self.woken = True

    async def wait(self, timeout: float) -> bool:
        """True when woken (the flag is cleared), False when ``timeout`` passed first."""
        if self.woken:
            self.woken = False
            return True
        future = self.future = self.loop.create_future()
        timer = self.loop.call_later(max(0.0, timeout), _time_out, future)
        try:
            return await future
        finally:
            timer.cancel()
            self.future = None


def _time_out(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(False)


def _set_all(waiters: list[AsyncWaiter]) -> None:
    for waiter in waiters:
        waiter.set()


def wake_on_loops(waiters: list[Waiter]) -> None:
    """Wake ``waiters`` in order; those of an event loop with one callback per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[AsyncWaiter]] = {}
    for waiter in waiters:
        if isinstance(waiter, AsyncWaiter):
            by_loop.setdefault(waiter.loop, []).append(waiter)
        else:
            waiter.wake()
    for loop, batch in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(_set_all, batch)


# --- the hub ------------------------------------------------------------------------------------


class Hub:
    """This process's listener: one connection, one thread, every waiter."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params
        self._lock = threading.Lock()
        self._waiters: dict[str, set[Waiter]] = {}
        self._listening = threading.Event()
        self._stopping = threading.Event()
        self.notifications = 0
        self.thread = threading.Thread(target=self._run, name="loopwright-wakeups", daemon=True)

    @property
    def listening(self) -> bool:
        return self._listening.is_set()

    def wait_listening(self, timeout: float) -> bool:
        return self._listening.wait(timeout)

    def subscribe(self, waiter: Waiter) -> None:
        with self._lock:
            for topic in waiter.topics:
                self._waiters.setdefault(topic, set()).add(waiter)

    def unsubscribe(self, waiter: Waiter) -> None:
        with self._lock:
            for topic in waiter.topics:
                waiters = self._waiters.get(topic)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del self._waiters[topic]

    def waiting(self) -> int:
        """How many waiters are subscribed (each counted once)."""
        with self._lock:
            return len({w for waiters in self._waiters.values() for w in waiters})

    def wake(self, run_id: str) -> None:
        """Wake the waiters of the run and those of every run (the early ones first)."""
        with self._lock:
            woken = set(self._waiters.get(run_topic(run_id), ()))
            woken |= self._waiters.get(ANY_RUN, set())
        wake_on_loops(sorted(woken, key=lambda w: not w.early))

    def _wake_all(self) -> None:
        with self._lock:
            woken = {w for waiters in self._waiters.values() for w in waiters}
        wake_on_loops(sorted(woken, key=lambda w: not w.early))

    def stop(self) -> None:
        self._stopping.set()
        self.thread.join(timeout=5)

    def _run(self) -> None:
        backoff = 0.1
        while not self._stopping.is_set():
            try:
                self._listen()
                backoff = 0.1
            except Exception:
                logger.warning("live stream wake-ups: listener failed; reconnecting", exc_info=True)
            self._listening.clear()
            self._stopping.wait(backoff)
            backoff = min(MAX_BACKOFF_SECONDS, backoff * 2)

    def _listen(self) -> None:
        with psycopg.connect(**self.params, autocommit=True) as listener:
            listener.execute(f"LISTEN {CHANNEL}")
            self._listening.set()
            self._wake_all()  # whatever was announced while nobody listened
            checked = time.monotonic()
            while not self._stopping.is_set():
                for notice in listener.notifies(timeout=1.0):
                    self.notifications += 1
                    self.wake(notice.payload)
                if time.monotonic() - checked >= CHECK_SECONDS:
                    listener.execute("SELECT 1")
                    checked = time.monotonic()


_hub: Hub | None = None
_hub_lock = threading.Lock()


def _listener_params() -> dict[str, Any] | None:
    """The default database's connection parameters, as Django would connect, without the
    options that only Django's own cursor understands; ``LOOPWRIGHT_LISTEN_DATABASE_URL`` when
    set. None behind a transaction pooler without it: a ``LISTEN`` needs a session of its own,
    which a transaction pooler does not give (streams poll instead, docs/operations.md)."""
    if settings.LISTEN_DATABASE_URL:
        return {"conninfo": settings.LISTEN_DATABASE_URL, "connect_timeout": 5}
    if settings.DB_POOLER:
        return None
    params = dict(connections[DEFAULT_DB_ALIAS].get_connection_params())
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    return params


def hub_stop() -> None:
    """Stop this process's hub and close its connection (tests, before their database is
    dropped); the next stream starts a new one."""
    global _hub
    with _hub_lock:
        stopping, _hub = _hub, None
    if stopping is not None:
        stopping.stop()


def hub() -> Hub | None:
    """This process's hub, started on first use; None where there is none (SQLite, a
    transaction pooler without a direct listening URL)."""
    global _hub
    if _hub is not None:  # the common case, without a lock or a connection lookup
        return _hub
    if not is_postgres():
        return None
    with _hub_lock:
        if _hub is None:
            params = _listener_params()
            if params is None:
                return None
            _hub = Hub(params)
            _hub.thread.start()
        return _hub

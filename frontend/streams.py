"""Live updates for the UI as server-sent events (``text/event-stream``).

Each stream is a *feed* polled against the database (the source of truth) every
``SSE_POLL_SECONDS``; what changed goes out as ``id:``/``event:``/``data:`` messages whose data is
JSON, carrying the HTML fragment rendered by the same template as the page, so the browser only
swaps elements. A comment line is sent as a heartbeat when nothing else was sent for
``SSE_HEARTBEAT_SECONDS``, and a stream ends after ``SSE_MAX_SECONDS`` (the browser's
EventSource reconnects and sends ``Last-Event-ID``; a reconnect is exact because it re-reads the
database from that point).

- ``/ui/stream/runs`` (the monitor): a run whose events or steps changed is sent as ``run``
  (or ``run-gone`` when it no longer matches the page's filters), the waiting/in-flight counts as
  ``summary``. The event id is a cursor ``e<event id>.s<step id>``; ids are re-scanned a little
  behind the cursor, because a PostgreSQL sequence hands out ids before their transactions
  commit, so a lower id can become visible after a higher one.
- ``/ui/stream/approvals`` (the approvals queue): ``queue`` with the re-rendered queue whenever
  its fingerprint (pending and total counts, newest request and decision) differs from the one
  the page (``?v=``) or the last message showed.
- ``/ui/stream/runs/<id>`` (a run's page): ``event`` per LoopEvent (event id = its ``seq``,
  which is written under the run's row lock, so seq order is commit order), ``step`` for a new or
  changed step (steps still open are re-read until they finish), ``run`` for the header, then
  ``done`` once the run is terminal and quiet.

Under ASGI the stream is an async generator that polls through ``sync_to_async``; under WSGI
(the test live server, or a WSGI deployment) it is a plain generator in the request's thread,
which gives back its database connection after every poll so an idle stream holds none.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.http import HttpRequest, StreamingHttpResponse
from django.middleware.csrf import get_token
from django.template.loader import render_to_string
from django.utils import timezone

from frontend import selectors
from frontend.access import ui_view
from frontend.views.runs import run_header_context
from loops import state
from loops.models import LoopEvent, LoopRun, LoopStep

logger = logging.getLogger(__name__)

DEFAULTS: dict[str, float] = {
    "SSE_POLL_SECONDS": 1.0,
    "SSE_HEARTBEAT_SECONDS": 15.0,
    "SSE_MAX_SECONDS": 300.0,
    "SSE_RETRY_MS": 2000,
}
#: How far behind its cursor the runs feed re-reads ids (late commits, see the module doc).
LOOKBACK = 100
#: Rows older than this when a stream starts are taken as already on the page (see _Scan).
GRACE = timedelta(seconds=10)
BATCH = 1000
_TERMINAL = frozenset(s.value for s in state.TERMINAL)


@dataclass(frozen=True)
class Timing:
    poll: float
    heartbeat: float
    lifetime: float
    retry_ms: int


def stream_timing() -> Timing:
    """From ``settings.LOOPWRIGHT_UI`` (optional) over :data:`DEFAULTS`."""
    conf = {**DEFAULTS, **getattr(settings, "LOOPWRIGHT_UI", {})}
    return Timing(
        poll=float(conf["SSE_POLL_SECONDS"]),
        heartbeat=float(conf["SSE_HEARTBEAT_SECONDS"]),
        lifetime=float(conf["SSE_MAX_SECONDS"]),
        retry_ms=int(conf["SSE_RETRY_MS"]),
    )


@dataclass(frozen=True)
class Message:
    """One server-sent event; ``data`` is JSON on a single line."""

    event: str
    data: dict[str, Any]
    id: str | None = None

    def encode(self) -> bytes:
        lines = [] if self.id is None else [f"id: {self.id}"]
        lines.append(f"event: {self.event}")
        lines.append("data: " + json.dumps(self.data, cls=DjangoJSONEncoder, separators=(",", ":")))
        return ("\n".join(lines) + "\n\n").encode()


class Feed(Protocol):
    finished: bool

    def poll(self) -> list[Message]: ...

    def farewell(self) -> Message: ...


# --- The monitor's feed -----------------------------------------------------------------------


@dataclass
class _Scan:
    """Ids of one table seen near the cursor, so a late-committed id is caught exactly once.

    On the first scan, rows at or below the cursor written more than :data:`GRACE` ago count as
    seen (the page that handed over the cursor showed them); newer ones may have committed after
    the page was drawn, so their runs are sent (an upsert: harmless if the page had them).
    """

    high: int
    seen: set[int] = field(default_factory=set)
    first: bool = True

    def changed_runs(self, model: type[LoopEvent] | type[LoopStep]) -> set[uuid.UUID]:
        rows = selectors.rows_after(model, max(0, self.high - LOOKBACK), BATCH)
        if self.first:
            self.first = False
            settled = timezone.now() - GRACE
            self.seen = {i for i, _, at in rows if i <= self.high and at < settled}
        runs = {run_id for row_id, run_id, _ in rows if row_id not in self.seen}
        self.seen.update(row_id for row_id, _, _ in rows)
        if rows:
            self.high = max(self.high, rows[-1][0])
        self.seen = {i for i in self.seen if i > self.high - LOOKBACK}
        return runs


class RunsFeed:
    """Runs that changed (new events or steps) since the cursor, and the waiting counts."""

    def __init__(
        self, request: HttpRequest, filters: selectors.RunFilters, cursor: selectors.ChangeCursor
    ) -> None:
        self.request = request
        self.filters = filters
        self.events = _Scan(cursor.event_id)
        self.steps = _Scan(cursor.step_id)
        self.counts: selectors.RunCounts | None = None
        self.finished = False

    @property
    def cursor(self) -> str:
        return selectors.ChangeCursor(self.events.high, self.steps.high).encode()

    def poll(self) -> list[Message]:
        changed = self.events.changed_runs(LoopEvent) | self.steps.changed_runs(LoopStep)
        out = [self._run_message(run) for run in selectors.runs_by_ids(changed)]
        counts = selectors.run_counts()
        if counts != self.counts:
            self.counts = counts
            html = render_to_string("frontend/runs/_counts.html", {"counts": counts})
            out.append(Message("summary", {**counts.__dict__, "html": html}))
        if out:
            out[-1] = Message(out[-1].event, out[-1].data, id=self.cursor)
        return out

    def _run_message(self, run: LoopRun) -> Message:
        if not self.filters.matches(run):
            return Message("run-gone", {"id": str(run.id), "status": run.status})
        html = render_to_string("frontend/runs/_row.html", {"run": run})
        data = {
            "id": str(run.id),
            "status": run.status,
            "created": run.created_at.isoformat(),
            "html": html,
        }
        return Message("run", data)

    def farewell(self) -> Message:
        return Message("bye", {}, id=self.cursor)


# --- The approvals queue's feed ----------------------------------------------------------------


class ApprovalsFeed:
    """The whole queue again whenever an approval was requested or decided (it is short)."""

    def __init__(self, request: HttpRequest, version: str) -> None:
        self.request = request
        self.version = version
        self.finished = False

    def poll(self) -> list[Message]:
        from frontend.views.approvals import queue_context, queue_version

        version = queue_version()
        if version == self.version:
            return []
        self.version = version
        context = queue_context(self.request)
        html = render_to_string("frontend/approvals/_queue.html", context, request=self.request)
        return [Message("queue", {"pending": len(context["pending"]), "html": html})]

    def farewell(self) -> Message:
        return Message("bye", {})


# --- A run's feed -----------------------------------------------------------------------------


class RunFeed:
    """New events, new or changed steps, and the header of one run."""

    def __init__(
        self,
        request: HttpRequest,
        run_id: uuid.UUID,
        *,
        after_event: int,
        after_step: int,
        open_steps: set[int],
    ) -> None:
        self.request = request
        self.run_id = run_id
        self.event_seq = after_event
        self.step_seq = after_step
        self.open_steps = set(open_steps)
        self.step_states: dict[int, tuple[str, Any]] = {}
        self.header_key: tuple[Any, ...] | None = None
        self.finished = False

    def poll(self) -> list[Message]:
        current = selectors.run_state(self.run_id)
        if current is None:
            self.finished = True
            return [Message("done", {"status": "deleted"})]
        out = self._events() + self._steps()
        quiet = not out
        header = self._header(current)
        if header is not None:
            out.append(header)
        if current["status"] in _TERMINAL and quiet and header is None:
            self.finished = True
            out.append(Message("done", {"status": current["status"]}, id=str(self.event_seq)))
        return out

    def _events(self) -> list[Message]:
        out = []
        for event in selectors.run_events(self.run_id, after_seq=self.event_seq):
            html = render_to_string("frontend/runs/_event.html", {"event": event})
            data = {"seq": event.seq, "type": event.type, "html": html}
            out.append(Message("event", data, id=str(event.seq)))
            self.event_seq = event.seq
        return out

    def _steps(self) -> list[Message]:
        bindings: dict[str, Any] | None = None
        out = []
        for step in selectors.run_steps(
            self.run_id, after_seq=self.step_seq, seqs=sorted(self.open_steps)
        ):
            key = (step.status, step.finished_at)
            self.step_seq = max(self.step_seq, step.seq)
            if step.status in selectors.OPEN_STEP_STATUSES:
                self.open_steps.add(step.seq)
            else:
                self.open_steps.discard(step.seq)
            if self.step_states.get(step.seq) == key:
                continue
            self.step_states[step.seq] = key
            if bindings is None:
                bindings = selectors.run_detail(self.run_id).role_bindings or {}
            out.append(self._step_message(step, bindings))
        return out

    def _step_message(self, step: LoopStep, bindings: dict[str, Any]) -> Message:
        group = selectors.invocation_group(step.invocation, step.role, bindings)
        data = {
            "seq": step.seq,
            "status": step.status,
            "invocation": step.invocation,
            "group": group.anchor,
            "html": render_to_string("frontend/runs/_step.html", {"step": step}),
            "group_html": render_to_string("frontend/runs/_group.html", {"group": group}),
        }
        return Message("step", data)

    def _header(self, current: dict[str, Any]) -> Message | None:
        key = (current["status"], current["updated_at"], current["step_count"])
        if key == self.header_key:
            return None
        self.header_key = key
        run = selectors.run_detail(self.run_id)
        context = run_header_context(self.request, run)
        data = {
            "status": run.status,
            "summary_html": render_to_string(
                "frontend/runs/_summary.html", context, request=self.request
            ),
            "actions_html": render_to_string(
                "frontend/runs/_actions.html", context, request=self.request
            ),
            "verdict_html": render_to_string("frontend/runs/_verdict.html", context),
            "artifacts_html": render_to_string("frontend/runs/_artifacts.html", context),
        }
        return Message("run", data)

    def farewell(self) -> Message:
        return Message("bye", {}, id=str(self.event_seq))


# --- Transport --------------------------------------------------------------------------------


class _OpenStreams:
    """How many streams are open in this process (for operations, and for tests to wait on)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def add(self, delta: int) -> None:
        with self._lock:
            self._count += delta

    @property
    def count(self) -> int:
        with self._lock:
            return self._count


OPEN_STREAMS = _OpenStreams()


class _Pacer:
    """Decides when to send a heartbeat and when the stream has lived long enough."""

    def __init__(self, timing: Timing) -> None:
        self.timing = timing
        self.started = self.last_sent = time.monotonic()

    def chunks(self, batch: list[Message]) -> list[bytes]:
        now = time.monotonic()
        out = [message.encode() for message in batch]
        if not out and now - self.last_sent >= self.timing.heartbeat:
            out.append(b": keepalive\n\n")
        if out:
            self.last_sent = now
        return out

    @property
    def expired(self) -> bool:
        return time.monotonic() - self.started >= self.timing.lifetime


def _poll(feed: Feed) -> list[Message] | None:
    """One poll; None when it failed (the stream then ends and the browser reconnects)."""
    try:
        return feed.poll()
    except Exception:
        logger.exception("live stream poll failed")
        return None


def _release_connection() -> None:
    """Give back this thread's connection (unless a transaction, e.g. a test's, holds it)."""
    if not connection.in_atomic_block:
        connection.close()


def _poll_releasing(feed: Feed) -> list[Message] | None:
    try:
        return _poll(feed)
    finally:
        _release_connection()


def sync_events(feed: Feed, timing: Timing) -> Iterator[bytes]:
    """The WSGI stream. A closed connection shows when a write fails (at the latest at the next
    heartbeat); the server then closes this generator."""
    pacer = _Pacer(timing)
    OPEN_STREAMS.add(1)
    try:
        yield f"retry: {timing.retry_ms}\n\n".encode()
        while not pacer.expired:
            batch = _poll_releasing(feed)
            if batch is None:
                return
            yield from pacer.chunks(batch)
            if feed.finished:
                return
            time.sleep(timing.poll)
        yield feed.farewell().encode()
    finally:
        OPEN_STREAMS.add(-1)


async def async_events(feed: Feed, timing: Timing) -> AsyncIterator[bytes]:
    """The ASGI stream; Django cancels it when the client disconnects."""
    pacer = _Pacer(timing)
    OPEN_STREAMS.add(1)
    try:
        yield f"retry: {timing.retry_ms}\n\n".encode()
        while not pacer.expired:
            batch = await sync_to_async(_poll)(feed)
            if batch is None:
                return
            for chunk in pacer.chunks(batch):
                yield chunk
            if feed.finished:
                return
            await asyncio.sleep(timing.poll)
        yield feed.farewell().encode()
    finally:
        OPEN_STREAMS.add(-1)
        await sync_to_async(_release_connection)()


def event_stream(request: HttpRequest, feed: Feed) -> StreamingHttpResponse:
    """The streaming response: async under ASGI, a plain generator under WSGI."""
    get_token(request)  # fragments carry forms: make sure the CSRF cookie exists
    timing = stream_timing()
    if isinstance(request, ASGIRequest):
        response = StreamingHttpResponse(async_events(feed, timing))
    else:
        response = StreamingHttpResponse(sync_events(feed, timing))
    response["Content-Type"] = "text/event-stream; charset=utf-8"
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # tell nginx-style proxies not to buffer
    return response


def _last_event_id(request: HttpRequest, fallback_param: str) -> str:
    return request.headers.get("Last-Event-ID") or request.GET.get(fallback_param, "")


@ui_view()
def runs_stream(request: HttpRequest) -> StreamingHttpResponse:
    """The monitor's live feed; the same filters as the page (``status``, ``pattern``...)."""
    filters = selectors.RunFilters.from_query(request.GET)
    cursor = selectors.ChangeCursor.decode(_last_event_id(request, "since"))
    feed = RunsFeed(request, filters, cursor or selectors.change_cursor_now())
    return event_stream(request, feed)


@ui_view()
def approvals_stream(request: HttpRequest) -> StreamingHttpResponse:
    """The approvals queue's live feed, from the fingerprint the page was drawn at (``?v=``)."""
    return event_stream(request, ApprovalsFeed(request, request.GET.get("v", "")))


def _int(value: str) -> int:
    return int(value) if value.isdigit() else 0


@ui_view()
def run_stream(request: HttpRequest, run_id: str) -> StreamingHttpResponse:
    """A run page's live feed: events after ``Last-Event-ID`` (or ``?after=``), steps after
    ``?steps=`` plus the ``?open=`` steps that were unfinished when the page was drawn."""
    run = selectors.run_detail(selectors.parse_run_id(run_id))
    open_steps = {int(s) for s in request.GET.get("open", "").split(",") if s.isdigit()}
    feed = RunFeed(
        request,
        run.id,
        after_event=_int(_last_event_id(request, "after")),
        after_step=_int(request.GET.get("steps", "")),
        open_steps=open_steps,
    )
    return event_stream(request, feed)

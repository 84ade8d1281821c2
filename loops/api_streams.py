"""``GET /api/v1/runs/{id}/stream``: a run's events and steps as server-sent events.

Messages (``data`` is one line of JSON):

- ``event`` (``id:`` its ``seq``): a LoopEvent as ``GET /runs/{id}/events`` gives it. A run's
  ``seq`` is written under its row lock, so seq order is commit order and ``Last-Event-ID`` (or
  ``?after_seq=``) resumes exactly.
- ``step``: a new or changed step (role, invocation, kind, status, tool or model name, tokens,
  cost, duration, error; not its request and response, which ``GET /runs/{id}/steps`` has),
  sent again when its status changes. A connection first sends the steps after ``?steps_after=``
  (default 0: all), so a client that reconnects may get a step again; it upserts by ``seq``.
- ``run``: the run's status, reasons and counts whenever they change; while it waits for
  approval, its pending approvals (id, step, tool, arguments, reason).
- ``done`` (``id:`` the last seq) once the run is terminal and everything was sent; ``bye`` when
  the stream reached ``SSE_MAX_SECONDS`` (reconnect with ``Last-Event-ID``).

The streams of one run in a process share a :class:`RunTail`: woken together by the wake-up hub
(``orchestrator.wakeups``), one of them reads the run (one query when nothing changed, a few
when something did) and the others take what it read, so 500 streams of a run cost the
database what one does.
"""

from __future__ import annotations

import asyncio
import bisect
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connection
from django.db.models import QuerySet
from django.http import HttpRequest, StreamingHttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.views import APIView

from loops import state
from loops.models import ActionApproval, ApprovalStatus, LoopEvent, LoopRun, LoopStep
from loops.serializers import EventSerializer
from orchestrator import sse, wakeups
from orchestrator.accounts.permissions import IsViewer
from orchestrator.pagination import bounded_int
from orchestrator.sse import EventStreamRenderer, Message

STEP_FIELDS = (
    "seq",
    "role",
    "invocation",
    "kind",
    "status",
    "name",
    "error",
    "tokens_in",
    "tokens_out",
    "cost",
    "started_at",
    "finished_at",
    "duration_ms",
)
RUN_FIELDS = (
    "status",
    "terminal_reason",
    "failure_reason",
    "event_seq",
    "step_count",
    "attempts",
    "updated_at",
)
#: Step changes a tail keeps (the oldest are dropped; a step's last state stays in ``steps``).
KEEP_CHANGES = 10_000
OPEN_STEPS = frozenset({"started", "gated", "approved"})
_TERMINAL = frozenset(s.value for s in state.TERMINAL)
T = TypeVar("T")
#: Events a tail keeps; a stream further behind reads its own catch-up.
KEEP_EVENTS = 1000


def _max_age() -> float:
    """How old a tail's last read may be without a wake-up: the safety poll while the hub
    listens (and no atomic block holds this thread's connection), else the short poll."""
    timing = sse.stream_timing()
    hub = wakeups.hub()
    listening = hub is not None and hub.listening and not connection.in_atomic_block
    return timing.safety if listening else timing.poll


def _releasing(read: Callable[[], T]) -> Callable[[], T]:
    """``read``, then this thread's connection given back (unless an atomic block holds it)."""

    def run() -> T:
        try:
            return read()
        finally:
            if not connection.in_atomic_block:
                connection.close()

    return run


def step_data(step: dict[str, Any]) -> dict[str, Any]:
    data = {name: step[name] for name in STEP_FIELDS}
    data["cost"] = str(step["cost"])
    return data


def _events_after(run_id: uuid.UUID, after: int) -> list[Message]:
    events: QuerySet[LoopEvent] = LoopEvent.objects.filter(run_id=run_id, seq__gt=after)
    return [
        Message("event", dict(EventSerializer(event).data), id=str(event.seq))
        for event in events.order_by("seq")
    ]


def _steps(run_id: uuid.UUID, after: int, seqs: set[int]) -> list[dict[str, Any]]:
    steps = LoopStep.objects.filter(run_id=run_id)
    wanted = steps.filter(seq__gt=after) | steps.filter(seq__in=sorted(seqs))
    return list(wanted.order_by("seq").values(*STEP_FIELDS))


class RunTail:
    """What this process last read of one run, shared by the streams that follow it.

    Its own waiter on the hub counts the run's wake-ups: :meth:`refresh` reads when the count
    moved since the last read (a read that begins after a wake-up sees the write announced), or
    when the last read is older than the safety poll (the short poll without a hub), so the
    streams of a run woken together, or by their staggered safety polls, cost one read.
    ``version`` counts the changes read; each step carries the version that last changed it."""

    def __init__(self, run_id: uuid.UUID, event_base: int) -> None:
        self.run_id = run_id
        self.lock = threading.Lock()
        self.wakeups = wakeups.CountingWaiter(frozenset({wakeups.run_topic(run_id)}))
        self.read_at = float("-inf")
        self.read_wakeups = -1
        self.max_age = 0.0
        self.version = 0
        self.events: list[Message] = []
        self.event_seqs: list[int] = []  # the seq of each of ``events``
        self.event_base = self.event_high = event_base
        self.step_high = 0
        self.steps: dict[int, tuple[int, Message]] = {}
        #: (version, step seq) of each step change read, in version order.
        self.changes: list[tuple[int, int]] = []
        self.trimmed = 0  # changes up to this version were dropped
        self.run: dict[str, Any] | None = None
        self.run_message: Message | None = None
        self.row_key: tuple[Any, ...] | None = None
        self.followers = 0
        self.inflight: asyncio.Future[None] | None = None

    def stale(self) -> bool:
        """Has a wake-up come since the last read, or is the last read too old?"""
        if self.wakeups.woken != self.read_wakeups:
            return True
        return time.monotonic() - self.read_at >= self.max_age

    def refresh(self) -> None:
        with self.lock:
            self.max_age = _max_age()
            if not self.stale():
                return
            woken = self.wakeups.woken
            self.read_at = time.monotonic()
            self._read()
            self.read_wakeups = woken

    async def refresh_async(self) -> None:
        """:meth:`refresh` in a thread, once for every stream of the run waiting on it (a
        stream that goes away does not cancel the others' read)."""
        if self.inflight is None or self.inflight.done():
            self.inflight = asyncio.ensure_future(
                sync_to_async(_releasing(self.refresh), thread_sensitive=False)()
            )
        await asyncio.shield(self.inflight)

    def _read(self) -> None:
        row = LoopRun.objects.filter(pk=self.run_id).values(*RUN_FIELDS).first()
        if row is None:
            self.version += 1
            self.run = {"status": "deleted"}
            self.run_message = Message("run", {"id": str(self.run_id), **self.run})
            return
        key = tuple(row[name] for name in RUN_FIELDS)
        if key == self.row_key:
            return
        self.row_key = key
        self.version += 1
        if row["event_seq"] > self.event_high:
            self._read_events()
        open_steps = {s for s, (_, step) in self.steps.items() if step.data["status"] in OPEN_STEPS}
        if row["step_count"] > self.step_high or open_steps:
            self._read_steps(open_steps)
        self._read_run(row)

    def _read_events(self) -> None:
        fresh = _events_after(self.run_id, self.event_high)
        if fresh:
            self.events.extend(fresh)
            self.event_seqs.extend(int(m.id or 0) for m in fresh)
            self.event_high = self.event_seqs[-1]
        if len(self.events) > KEEP_EVENTS:
            self.event_base = self.event_seqs[-KEEP_EVENTS - 1]
            del self.events[:-KEEP_EVENTS], self.event_seqs[:-KEEP_EVENTS]

    def _read_steps(self, open_steps: set[int]) -> None:
        for step in _steps(self.run_id, self.step_high, open_steps):
            seq = int(step["seq"])
            self.step_high = max(self.step_high, seq)
            known = self.steps.get(seq)
            data = step_data(step)
            if known is None or known[1].data != data:
                self.steps[seq] = (self.version, Message("step", data))
                self.changes.append((self.version, seq))
        if len(self.changes) > KEEP_CHANGES:
            self.trimmed = self.changes[-KEEP_CHANGES - 1][0]
            del self.changes[: len(self.changes) - KEEP_CHANGES]

    def _read_run(self, row: dict[str, Any]) -> None:
        data = {name: row[name] for name in RUN_FIELDS if name != "updated_at"}
        if row["status"] == "waiting_approval":
            data["pending_approvals"] = list(
                ActionApproval.objects.filter(run_id=self.run_id, status=ApprovalStatus.PENDING)
                .order_by("created_at")
                .values("id", "step_seq", "tool_name", "arguments", "reason")
            )
        if data != self.run:
            self.run = data
            self.run_message = Message("run", {"id": str(self.run_id), **data})


class _Tails:
    """The tails of this process, by run, while streams follow them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_run: dict[uuid.UUID, RunTail] = {}

    def follow(self, run_id: uuid.UUID, after: int) -> RunTail:
        with self.lock:
            tail = self.by_run.get(run_id)
            if tail is None:
                tail = self.by_run[run_id] = RunTail(run_id, after)
                hub = wakeups.hub()
                if hub is not None:
                    hub.subscribe(tail.wakeups)
            tail.followers += 1
            return tail

    def leave(self, tail: RunTail) -> None:
        with self.lock:
            tail.followers -= 1
            if tail.followers <= 0:
                self.by_run.pop(tail.run_id, None)
                hub = wakeups.hub()
                if hub is not None:
                    hub.unsubscribe(tail.wakeups)


TAILS = _Tails()


class RunStreamFeed:
    """One client's view of a run: its cursors over the shared :class:`RunTail`."""

    def __init__(self, run_id: uuid.UUID, *, after_seq: int, steps_after: int) -> None:
        self.run_id = run_id
        self.event_seq = after_seq
        self.steps_after = steps_after
        self.seen_version = 0
        self.sent_steps: dict[int, Message] = {}
        self.sent_run: Message | None = None
        self.finished = False
        self.tail: RunTail | None = None

    def poll(self) -> list[Message]:
        first = self.tail is None
        if self.tail is None:
            self.tail = TAILS.follow(self.run_id, self.event_seq)
        tail = self.tail
        tail.refresh()
        out = self._behind(tail) if first else []
        return out + self._collect(tail, first)

    async def poll_async(self) -> list[Message]:
        """:meth:`poll` on the event loop: the first read in a thread; later, the tail's read
        (one for all its streams) when it is stale, and the rest from memory."""
        if self.tail is None or self._behind_tail(self.tail):
            return await sync_to_async(_releasing(self.poll))()
        if self.tail.stale():
            await self.tail.refresh_async()
        if self._behind_tail(self.tail):  # the tail dropped events this stream has not sent
            return await sync_to_async(_releasing(self.poll))()
        return self._collect(self.tail, False)

    def _behind_tail(self, tail: RunTail) -> bool:
        return self.event_seq < tail.event_base

    def _collect(self, tail: RunTail, first: bool) -> list[Message]:
        """What this stream has not sent of what the tail read."""
        with tail.lock:
            out = self._events(tail) + self._steps(tail, first) + self._run(tail)
            self.seen_version = tail.version
            status = (tail.run or {}).get("status")
        if status in _TERMINAL or status == "deleted":
            self.finished = True
            out.append(Message("done", {"status": status}, id=str(self.event_seq)))
        return out

    def _behind(self, tail: RunTail) -> list[Message]:
        """On the first read: the events between the client's cursor and the tail's first."""
        out = []
        if self.event_seq < tail.event_base:
            for message in _events_after(self.run_id, self.event_seq):
                if int(message.id or 0) > tail.event_base:
                    break
                out.append(message)
                self.event_seq = int(message.id or 0)
        return out

    def _events(self, tail: RunTail) -> list[Message]:
        if self.event_seq < tail.event_base:  # fell behind what the tail keeps: read our own
            fresh = _events_after(self.run_id, self.event_seq)
        else:
            fresh = tail.events[bisect.bisect_right(tail.event_seqs, self.event_seq) :]
        if fresh:
            self.event_seq = int(fresh[-1].id or 0)
        return fresh

    def _steps(self, tail: RunTail, first: bool) -> list[Message]:
        """Every step after ``steps_after`` on the first read, then those that changed."""
        if first or self.seen_version < tail.trimmed:
            seqs = sorted(tail.steps)
        else:
            start = bisect.bisect_right(tail.changes, (self.seen_version, 2**63))
            seqs = sorted({seq for _, seq in tail.changes[start:]})
        out = []
        for seq in seqs:
            message = tail.steps[seq][1]
            if seq > self.steps_after and self.sent_steps.get(seq) is not message:
                self.sent_steps[seq] = message
                out.append(message)
        return out

    def _run(self, tail: RunTail) -> list[Message]:
        if tail.run_message is None or tail.run_message is self.sent_run:
            return []
        self.sent_run = tail.run_message
        return [tail.run_message]

    def close(self) -> None:
        """The stream ended: the tail is dropped when no stream follows it any more."""
        if self.tail is not None:
            TAILS.leave(self.tail)
            self.tail = None

    def farewell(self) -> Message:
        return Message("bye", {}, id=str(self.event_seq))


def run_event_stream(
    request: HttpRequest, run_id: uuid.UUID, *, after_seq: int, steps_after: int
) -> StreamingHttpResponse:
    """The run's stream, woken by the hub on the run's topic."""
    feed = RunStreamFeed(run_id, after_seq=after_seq, steps_after=steps_after)
    wake = sse.Wake(frozenset({wakeups.run_topic(run_id)}))
    return sse.event_stream(request, feed, wake)


# --- the view -----------------------------------------------------------------------------------

#: The largest seq a query may name (a 64-bit integer column).
MAX_SEQ = 2**63 - 1
_PROBLEM = OpenApiResponse(description="application/problem+json")
#: One server-sent event of a run's stream (the schema applies to each event).
_STREAM_EVENT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "event": {"type": "string", "enum": ["event", "step", "run", "done", "bye", "error"]},
        "id": {"type": "string"},
        "data": {"type": "string", "description": "JSON"},
    },
    "required": ["event", "data"],
}


class RunStreamView(APIView):
    """A run's events, steps and state as server-sent events, live while it runs."""

    permission_classes = [IsViewer]
    renderer_classes = [JSONRenderer, EventStreamRenderer]

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        """A refusal rendered as an ``error`` event (a client that accepts only
        ``text/event-stream``) says so in its content type; problem+json otherwise."""
        response = super().finalize_response(request, response, *args, **kwargs)
        if isinstance(getattr(request, "accepted_renderer", None), EventStreamRenderer):
            response.content_type = "text/event-stream; charset=utf-8"
        return response

    @extend_schema(
        operation_id="runs_stream",
        parameters=[
            OpenApiParameter(
                "after_seq",
                {"type": "integer", "minimum": 0, "maximum": MAX_SEQ},
                description="Start after this event seq (or send the `Last-Event-ID` header).",
            ),
            OpenApiParameter(
                "steps_after",
                {"type": "integer", "minimum": 0, "maximum": MAX_SEQ},
                description="Send only the steps after this step seq (default 0: all).",
            ),
        ],
        responses={
            (200, "text/event-stream"): OpenApiResponse(
                response=_STREAM_EVENT,
                description="`event: event` per run event (`id:` its seq, `data:` the event as "
                "JSON, as `GET /runs/{id}/events`), `event: step` per new or changed step "
                "(seq, role, invocation, kind, status, name, error, tokens_in, tokens_out, "
                "cost, started_at, finished_at, duration_ms), `event: run` when the run's "
                "status or counts change (with `pending_approvals` while it waits for "
                "approval), then `event: done` with the final status once the run is terminal; "
                "`event: bye` after `SSE_MAX_SECONDS` (reconnect with `Last-Event-ID`). "
                "A `: keepalive` comment when nothing was sent for `SSE_HEARTBEAT_SECONDS`.",
            ),
            400: _PROBLEM,
            404: _PROBLEM,
        },
        description="The run's events and steps as server-sent events (docs/observability.md).",
    )
    def get(self, request: Request, pk: str) -> StreamingHttpResponse:
        try:
            run_id = uuid.UUID(pk)
        except ValueError as exc:
            raise ValidationError({"id": ["Not a valid run id (a UUID)."]}) from exc
        if not LoopRun.objects.filter(pk=run_id).exists():
            raise NotFound("No run with this id.")
        cursor = request.headers.get("Last-Event-ID") or request.query_params.get("after_seq")
        after_seq = bounded_int({"after_seq": cursor}, "after_seq", default=0, low=0, high=MAX_SEQ)
        steps_after = bounded_int(
            request.query_params, "steps_after", default=0, low=0, high=MAX_SEQ
        )
        return run_event_stream(
            request._request, run_id, after_seq=after_seq, steps_after=steps_after
        )

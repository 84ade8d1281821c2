"""Live updates for the UI as server-sent events (``text/event-stream``).

Each stream is a *feed* read from the database (the source of truth) by the platform's
transport (``orchestrator.sse``: wake-ups, pacing, heartbeats, lifetime, ASGI and WSGI) when the
wake-up hub says a run changed (a run page: its run; the monitor and the approvals queue: any
run, read at most every :data:`ANY_RUN_GAP_SECONDS`), or every ``SSE_POLL_SECONDS`` where there
is no hub (SQLite); what changed goes
out as messages whose data is JSON carrying the HTML fragment rendered by the same template as
the page, so the browser only swaps elements. A reconnect (``Last-Event-ID``) is exact because
it re-reads the database from that point.

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
  ``done`` once the run is terminal and quiet. While a model step streams, ``live`` carries the
  text it has released so far (``loops.live_text``: an entry in Redis or under ``VAR_DIR``,
  written by the worker at most every 250 ms, never a database row), and ``live`` with empty
  ``html`` once the entry is gone (the step itself follows as ``step``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.http import HttpRequest, StreamingHttpResponse
from django.middleware.csrf import get_token
from django.template.loader import render_to_string
from django.utils import timezone

from frontend.access import ui_view
from frontend.selectors import approvals, monitor, runs
from frontend.selectors.waterfall import run_waterfall
from frontend.views.approvals import queue_context
from frontend.views.runs import run_header_context
from loops import live_text, state
from loops.models import LoopEvent, LoopRun, LoopStep
from orchestrator import sse, wakeups
from orchestrator.sse import Message, Wake

#: How far behind its cursor the runs feed re-reads ids (late commits, see the module doc).
LOOKBACK = 100
#: Rows older than this when a stream starts are taken as already on the page (see _Scan).
GRACE = timedelta(seconds=10)
BATCH = 1000
_TERMINAL = frozenset(s.value for s in state.TERMINAL)
#: The least time between two reads of a stream that every run's writes wake (the monitor, the
#: approvals queue): a busy engine wakes them often, their pages need no more.
ANY_RUN_GAP_SECONDS = 0.5
ANY_RUN = Wake(frozenset({wakeups.ANY_RUN}), gap=ANY_RUN_GAP_SECONDS)


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
        rows = runs.rows_after(model, max(0, self.high - LOOKBACK), BATCH)
        if self.first:
            self.first = False
            settled = timezone.now() - GRACE
            self.seen = {i for i, _, at in rows if i <= self.high and at < settled}
        changed = {run_id for row_id, run_id, _ in rows if row_id not in self.seen}
        self.seen.update(row_id for row_id, _, _ in rows)
        if rows:
            self.high = max(self.high, rows[-1][0])
        self.seen = {i for i in self.seen if i > self.high - LOOKBACK}
        return changed


class RunsFeed:
    """Runs that changed (new events or steps) since the cursor, and the waiting counts."""

    def __init__(
        self, request: HttpRequest, filters: monitor.RunFilters, cursor: runs.ChangeCursor
    ) -> None:
        self.request = request
        self.filters = filters
        self.events = _Scan(cursor.event_id)
        self.steps = _Scan(cursor.step_id)
        self.counts: runs.RunCounts | None = None
        self.finished = False

    @property
    def cursor(self) -> str:
        return runs.ChangeCursor(self.events.high, self.steps.high).encode()

    def poll(self) -> list[Message]:
        changed = self.events.changed_runs(LoopEvent) | self.steps.changed_runs(LoopStep)
        out = [self._run_message(run) for run in runs.runs_by_ids(changed)]
        counts = runs.run_counts()
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
        version = approvals.queue_version()
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
        #: invocation → (role, chars) of the live text last sent.
        self.live: dict[str, tuple[str, int]] = {}
        self.header_key: tuple[Any, ...] | None = None
        self.finished = False
        self.active = True
        self._bindings: dict[str, Any] | None = None

    def poll(self) -> list[Message]:
        current = runs.run_state(self.run_id)
        if current is None:
            self.finished = True
            return [Message("done", {"status": "deleted"})]
        self._bindings = None
        self.active = current["status"] not in _TERMINAL
        out = self._events() + self._steps()
        quiet = not out
        out += self._live()
        header = self._header(current)
        if header is not None:
            out.append(header)
        if current["status"] in _TERMINAL and quiet and header is None:
            self.finished = True
            out.append(Message("done", {"status": current["status"]}, id=str(self.event_seq)))
        return out

    def _events(self) -> list[Message]:
        out = []
        for event in runs.run_events(self.run_id, after_seq=self.event_seq):
            html = render_to_string("frontend/runs/_event.html", {"event": event})
            data = {"seq": event.seq, "type": event.type, "html": html}
            out.append(Message("event", data, id=str(event.seq)))
            self.event_seq = event.seq
        return out

    def bindings(self) -> dict[str, Any]:
        """The run's role bindings, read at most once per poll and only when needed."""
        if self._bindings is None:
            self._bindings = runs.run_detail(self.run_id).role_bindings or {}
        return self._bindings

    def _steps(self) -> list[Message]:
        out = []
        for step in runs.run_steps(
            self.run_id, after_seq=self.step_seq, seqs=sorted(self.open_steps)
        ):
            key = (step.status, step.finished_at)
            self.step_seq = max(self.step_seq, step.seq)
            if step.status in runs.OPEN_STEP_STATUSES:
                self.open_steps.add(step.seq)
            else:
                self.open_steps.discard(step.seq)
            if self.step_states.get(step.seq) == key:
                continue
            self.step_states[step.seq] = key
            out.append(self._step_message(step, self.bindings()))
        return out

    def between(self) -> list[Message]:
        """Between reads on the wake-up hub: the live text (not a database row, so no write
        announces it) while the run is not finished; once it is, a read, until one finds it
        quiet and says ``done``."""
        return self._live() if self.active else self.poll()

    def _live(self) -> list[Message]:
        """The live text of each model step in flight that changed, and ends of live text."""
        out = []
        entries = {entry.invocation: entry for entry in live_text.read(self.run_id)}
        for invocation, (role, _) in list(self.live.items()):
            if invocation not in entries:
                del self.live[invocation]
                group = runs.invocation_group(invocation, role, self.bindings())
                gone = {"invocation": invocation, "group": group.anchor, "html": ""}
                out.append(Message("live", gone))
        for invocation, entry in entries.items():
            if self.live.get(invocation) == (entry.role, entry.chars):
                continue
            self.live[invocation] = (entry.role, entry.chars)
            group = runs.invocation_group(invocation, entry.role, self.bindings())
            context = {"live": entry, "group": group}
            data: dict[str, Any] = {
                "invocation": invocation,
                "group": group.anchor,
                "text": entry.text,
                "chars": entry.chars,
                "html": render_to_string("frontend/runs/_live.html", context),
                "group_html": render_to_string("frontend/runs/_group.html", {"group": group}),
            }
            out.append(Message("live", data))
        return out

    def _step_message(self, step: LoopStep, bindings: dict[str, Any]) -> Message:
        group = runs.invocation_group(step.invocation, step.role, bindings)
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
        run = runs.run_detail(self.run_id)
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
            "waterfall_html": render_to_string(
                "frontend/runs/_waterfall.html",
                {**context, "waterfall": run_waterfall(run, timezone.now())},
            ),
        }
        return Message("run", data)

    def farewell(self) -> Message:
        return Message("bye", {}, id=str(self.event_seq))


# --- Views -----------------------------------------------------------------------------------


def event_stream(request: HttpRequest, feed: sse.Feed, wake: Wake) -> StreamingHttpResponse:
    """The feed as a server-sent-events response, woken by the hub (``wake``); fragments carry
    forms, so the CSRF cookie is set first."""
    get_token(request)
    return sse.event_stream(request, feed, wake)


@ui_view()
def runs_stream(request: HttpRequest) -> StreamingHttpResponse:
    """The monitor's live feed; the same filters as the page (``status``, ``pattern``...)."""
    filters = monitor.RunFilters.from_query(request.GET)
    cursor = runs.ChangeCursor.decode(sse.last_event_id(request, "since"))
    feed = RunsFeed(request, filters, cursor or runs.change_cursor_now())
    return event_stream(request, feed, ANY_RUN)


@ui_view()
def approvals_stream(request: HttpRequest) -> StreamingHttpResponse:
    """The approvals queue's live feed, from the fingerprint the page was drawn at (``?v=``)."""
    return event_stream(request, ApprovalsFeed(request, request.GET.get("v", "")), ANY_RUN)


def _int(value: str) -> int:
    return int(value) if value.isdigit() else 0


@ui_view()
def run_stream(request: HttpRequest, run_id: str) -> StreamingHttpResponse:
    """A run page's live feed: events after ``Last-Event-ID`` (or ``?after=``), steps after
    ``?steps=`` plus the ``?open=`` steps that were unfinished when the page was drawn."""
    run = runs.run_detail(runs.parse_run_id(run_id))
    open_steps = {int(s) for s in request.GET.get("open", "").split(",") if s.isdigit()}
    feed = RunFeed(
        request,
        run.id,
        after_event=_int(sse.last_event_id(request, "after")),
        after_step=_int(request.GET.get("steps", "")),
        open_steps=open_steps,
    )
    return event_stream(request, feed, Wake(frozenset({wakeups.run_topic(run.id)})))

"""The live-update endpoints: server-sent event format, Last-Event-ID, heartbeats, the end of a
stream, both transports (WSGI generator and ASGI async generator), and what the feeds send."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client, RequestFactory
from django.utils import timezone

from frontend.selectors import monitor, runs
from frontend.streams import RunFeed, RunsFeed
from loops.models import LoopStep, RunStatus
from loops.services.runs import run_act
from orchestrator.sse import OPEN_STREAMS
from tests.support.factories import make_pattern, make_run
from tests.ui.conftest import make_user

pytestmark = pytest.mark.django_db
ClientAs = Callable[[str], Client]


@pytest.fixture(autouse=True)
def _short_streams(settings: Any) -> None:
    settings.LOOPWRIGHT_UI = {
        "SSE_POLL_SECONDS": 0.05,
        "SSE_HEARTBEAT_SECONDS": 0.2,
        "SSE_MAX_SECONDS": 0.5,
        "SSE_RETRY_MS": 1500,
    }


@dataclass
class Sse:
    """A parsed stream: messages (id, event, data) plus retry and comment lines."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    retry: int | None = None
    comments: list[str] = field(default_factory=list)

    def of(self, event: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["event"] == event]


def parse(body: str) -> Sse:
    parsed = Sse()
    assert body.endswith("\n\n"), "every SSE block ends with a blank line"
    for block in body.split("\n\n")[:-1]:
        message: dict[str, Any] = {"id": None}
        for line in block.split("\n"):
            name, _, value = line.partition(": ")
            if line.startswith(":"):
                parsed.comments.append(line[1:].strip())
            elif name == "retry":
                parsed.retry = int(value)
            elif name == "data":
                message["data"] = json.loads(value)  # one line of JSON per message
            else:
                assert name in {"id", "event"}, line
                message[name] = value
        if "event" in message:
            parsed.messages.append(message)
    return parsed


def read(response: Any) -> Sse:
    assert response["Content-Type"] == "text/event-stream; charset=utf-8"
    assert response["Cache-Control"] == "no-cache"
    return parse(b"".join(response.streaming_content).decode())


def test_a_run_stream_sends_events_after_last_event_id(client_as: ClientAs) -> None:
    run = make_run(status=RunStatus.RUNNING)
    run_act(run_id=run.id, action="pause", actor="ops")  # seq 2
    run_act(run_id=run.id, action="resume", actor="ops")  # seq 3
    stream = read(client_as("viewer").get(f"/ui/stream/runs/{run.id}", HTTP_LAST_EVENT_ID="1"))
    assert stream.retry == 1500
    events = stream.of("event")
    assert [(m["id"], m["data"]["seq"], m["data"]["type"]) for m in events] == [
        ("2", 2, "run.paused"),
        ("3", 3, "run.resumed"),
    ]
    assert '<tr id="event-3"' in events[1]["data"]["html"]
    header = stream.of("run")[0]["data"]
    assert header["status"] == "queued"
    assert "Pause" not in header["actions_html"]  # a viewer gets no buttons
    assert stream.of("bye")[-1]["id"] == "3"  # a reconnect resumes after the last event


def test_the_after_parameter_stands_in_for_last_event_id(client_as: ClientAs) -> None:
    run = make_run(status=RunStatus.RUNNING)
    run_act(run_id=run.id, action="pause", actor="ops")
    stream = read(client_as("viewer").get(f"/ui/stream/runs/{run.id}?after=1"))
    assert [m["data"]["seq"] for m in stream.of("event")] == [2]
    header_seen_by_operator = read(client_as("operator").get(f"/ui/stream/runs/{run.id}?after=2"))
    actions = header_seen_by_operator.of("run")[0]["data"]["actions_html"]
    assert ">Resume</button>" in actions and "csrfmiddlewaretoken" in actions


def test_a_finished_run_stream_says_done_and_ends_at_once(client_as: ClientAs) -> None:
    run = make_run(status=RunStatus.SUCCEEDED)
    started = time.monotonic()
    stream = read(client_as("viewer").get(f"/ui/stream/runs/{run.id}?after=1"))
    assert time.monotonic() - started < 10  # long before the stream's 30 s lifetime
    assert [m["event"] for m in stream.messages] == ["run", "done"]
    assert stream.of("done")[0]["data"] == {"status": "succeeded"}


def test_a_quiet_stream_sends_heartbeats_then_a_farewell_with_its_cursor(
    client_as: ClientAs,
) -> None:
    run = make_run(status=RunStatus.QUEUED)
    stream = read(client_as("viewer").get(f"/ui/stream/runs/{run.id}?after=1"))
    assert "keepalive" in stream.comments
    assert stream.messages[-1]["event"] == "bye"
    assert OPEN_STREAMS.count == 0


def test_an_unknown_run_stream_is_an_html_404(client_as: ClientAs) -> None:
    response = client_as("viewer").get(f"/ui/stream/runs/{uuid.uuid4()}")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


def test_the_runs_stream_sends_new_runs_and_honours_last_event_id(client_as: ClientAs) -> None:
    pattern = make_pattern(key="greet")
    old = make_run(pattern)
    cursor = runs.change_cursor_now().encode()
    new = make_run(pattern)
    client = client_as("viewer")
    stream = read(client.get("/ui/stream/runs", HTTP_LAST_EVENT_ID=cursor))
    sent = [m["data"]["id"] for m in stream.of("run")]
    assert str(new.id) in sent
    message = next(m for m in stream.of("run") if m["data"]["id"] == str(new.id))
    assert f'<tr id="run-{new.id}"' in message["data"]["html"]
    assert message["data"]["status"] == "queued"
    summary = stream.of("summary")[0]["data"]
    assert summary["queued"] == 2 and "waiting for approval" in summary["html"]
    ids = [m["id"] for m in stream.messages if m["id"]]
    assert ids and all(runs.ChangeCursor.decode(i) for i in ids)
    # The cursor re-reads a little behind itself (late commits), so the older run may come too;
    # from a cursor far ahead, nothing but the counts does.
    quiet = read(client.get("/ui/stream/runs", HTTP_LAST_EVENT_ID="e100000.s100000"))
    assert quiet.of("run") == [] and len(quiet.of("summary")) == 1
    assert old.id  # created before the cursor


def test_the_runs_stream_applies_the_page_filters(client_as: ClientAs) -> None:
    pattern = make_pattern(key="greet")
    cursor = runs.change_cursor_now().encode()
    queued = make_run(pattern)
    paused = make_run(pattern, status=RunStatus.PAUSED)
    stream = read(client_as("viewer").get(f"/ui/stream/runs?status=queued&since={cursor}"))
    assert [m["data"]["id"] for m in stream.of("run")] == [str(queued.id)]
    assert [m["data"]["id"] for m in stream.of("run-gone")] == [str(paused.id)]


def _request(persona: str = "viewer") -> Any:
    request = RequestFactory().get("/ui/stream/runs")
    request.user = make_user(persona)
    return request


def test_the_runs_feed_reports_a_run_once_per_change_and_counts_on_change() -> None:
    pattern = make_pattern(key="greet")
    feed = RunsFeed(_request(), monitor.RunFilters(), runs.change_cursor_now())
    assert [m.event for m in feed.poll()] == ["summary"]
    run = make_run(pattern)
    assert [m.event for m in feed.poll()] == ["run", "summary"]
    assert feed.poll() == []
    run_act(run_id=run.id, action="cancel", actor="ops")
    changed = feed.poll()
    assert [(m.event, m.data.get("status")) for m in changed] == [
        ("run", "canceled"),
        ("summary", None),
    ]


def test_the_runs_feed_catches_an_id_that_commits_after_a_higher_one() -> None:
    pattern = make_pattern(key="greet")
    early = make_run(pattern)
    late = make_run(pattern)
    late_event = late.events.get()
    # Pretend the cursor had already passed the late run's event id when it became visible.
    cursor = runs.ChangeCursor(late_event.id, 0)
    feed = RunsFeed(_request(), monitor.RunFilters(), cursor)
    feed.poll()
    # ...and that the early run's event had not been visible to that poll.
    feed.events.seen.discard(early.events.get().id)
    sent = [m.data["id"] for m in feed.poll() if m.event == "run"]
    assert sent == [str(early.id)]
    assert feed.poll() == []


def test_a_new_runs_stream_resends_only_recent_changes_below_its_cursor() -> None:
    pattern = make_pattern(key="greet")
    settled, recent = make_run(pattern), make_run(pattern)
    settled.events.update(created_at=timezone.now() - timedelta(minutes=5))
    feed = RunsFeed(_request(), monitor.RunFilters(), runs.change_cursor_now())
    sent = [m.data["id"] for m in feed.poll() if m.event == "run"]
    assert sent == [str(recent.id)]  # it may have committed after the page was drawn


def test_a_run_feed_resends_a_step_when_it_changes_and_groups_it() -> None:
    run = make_run(status=RunStatus.RUNNING)
    step = LoopStep.objects.create(
        run=run, seq=1, role="maker", invocation="maker:0", kind="tool", status="started",
        name="write", request={"arguments": {"path": "a.txt"}},
    )  # fmt: skip
    feed = RunFeed(_request(), run.id, after_event=1, after_step=0, open_steps=set())
    first = [m for m in feed.poll() if m.event == "step"]
    assert [m.data["status"] for m in first] == ["started"]
    assert first[0].data["group"] == "inv-maker-0"
    assert "Maker 1" in first[0].data["group_html"]
    assert "a.txt" in first[0].data["html"]
    assert [m.event for m in feed.poll()] == []
    LoopStep.objects.filter(pk=step.pk).update(status="completed", response={"content": "ok"})
    again = [m for m in feed.poll() if m.event == "step"]
    assert [m.data["status"] for m in again] == ["completed"]
    assert feed.open_steps == set()


def test_the_asgi_transport_streams_the_same_messages() -> None:
    run = make_run(status=RunStatus.RUNNING)
    run_act(run_id=run.id, action="pause", actor="ops")
    client = AsyncClient()
    client.force_login(make_user("viewer"))

    async def fetch() -> tuple[Any, str]:
        response: Any = await client.get(
            f"/ui/stream/runs/{run.id}", headers={"Last-Event-ID": "1"}
        )
        assert isinstance(response.streaming_content, AsyncIterator)  # the async generator
        chunks = [chunk async for chunk in response.streaming_content]
        return response, b"".join(chunks).decode()

    response, body = async_to_sync(fetch)()
    assert response["Content-Type"] == "text/event-stream; charset=utf-8"
    stream = parse(body)
    assert [m["data"]["seq"] for m in stream.of("event")] == [2]
    assert stream.of("run")[0]["data"]["status"] == "paused"
    assert OPEN_STREAMS.count == 0

"""``GET /api/v1/runs/{id}/stream`` over the production ASGI app under uvicorn on loopback: the
events, steps (tokens, cost) and end of a run written by the services, ``Last-Event-ID``
resuming exactly, the wake-up hub (PostgreSQL ``LISTEN/NOTIFY``) waking a stream whose poll
and safety poll are far away, and one read shared by the streams of a run."""

from __future__ import annotations

import gc
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
import pytest
import uvicorn
from django.db import connection

from loops import api_streams
from loops.models import LoopRun, RunStatus
from loops.services.claims import run_claim
from loops.services.endings import run_transition
from loops.services.steps import step_record
from loops.services.transitions import Lease, run_event_append
from orchestrator import wakeups
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import api_token_create, user_ensure
from tests.support.factories import make_pattern, make_run

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass
class Server:
    url: str
    token: str

    def stream_url(self, run_id: uuid.UUID | str) -> str:
        return f"{self.url}/api/v1/runs/{run_id}/stream"


@pytest.fixture
def stream_settings(settings: Any) -> dict[str, float]:
    """Short timings (a test can lengthen them); the polls stay well below a test's patience."""
    settings.LOOPWRIGHT_UI = {
        "SSE_POLL_SECONDS": 0.05,
        "SSE_SAFETY_POLL_SECONDS": 0.5,
        "SSE_HEARTBEAT_SECONDS": 0.3,
        "SSE_MAX_SECONDS": 20.0,
        "SSE_RETRY_MS": 500,
    }
    return settings.LOOPWRIGHT_UI  # type: ignore[no-any-return]


@pytest.fixture
def asgi_server(
    seeded_profiles: None, monkeypatch: pytest.MonkeyPatch, stream_settings: dict[str, float]
) -> Iterator[Server]:
    """The production ASGI app (``orchestrator.asgi``) under uvicorn, in a thread, and a
    viewer's API token."""
    from django.db import connections

    from orchestrator.asgi import application

    # Django closes a request's connection at its end only with CONN_MAX_AGE 0.
    monkeypatch.setitem(connections["default"].settings_dict, "CONN_MAX_AGE", 0)
    token = api_token_create(user=user_ensure(username="watcher", roles=[Role.OPERATOR]))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        application, log_level="warning", lifespan="on", timeout_graceful_shutdown=2
    )
    instance = uvicorn.Server(config)
    thread = threading.Thread(target=instance.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not instance.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield Server(f"http://127.0.0.1:{port}", token)
    instance.should_exit = True
    thread.join(timeout=30)
    sock.close()
    gc.unfreeze()  # the app's lifespan froze this (test) process's heap: give it back


@dataclass
class Received:
    """What a stream sent: messages as (event, id, data, monotonic time received)."""

    messages: list[tuple[str, str | None, Any, float]] = field(default_factory=list)
    comments: int = 0
    done: threading.Event = field(default_factory=threading.Event)

    def of(self, event: str) -> list[Any]:
        return [data for kind, _, data, _ in self.messages if kind == event]

    def ids(self, event: str) -> list[str | None]:
        return [ident for kind, ident, _, _ in self.messages if kind == event]

    def wait_for(self, found: Callable[[Received], bool], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not found(self):
            assert time.monotonic() < deadline, self.messages
            time.sleep(0.02)


def _read(response: Any, received: Received) -> None:
    event, ident, data = "message", None, ""
    for line in response.iter_lines():
        if not line:
            if data:
                received.messages.append((event, ident, json.loads(data), time.monotonic()))
            event, ident, data = "message", None, ""
        elif line.startswith(":"):
            received.comments += 1
        else:
            name, _, value = line.partition(": ")
            if name == "event":
                event = value
            elif name == "id":
                ident = value
            elif name == "data":
                data = value


def follow(
    server: Server, run_id: uuid.UUID, headers: dict[str, str] | None = None, **params: Any
) -> Received:
    """Read the run's stream in a thread until it ends."""
    received = Received()

    def read() -> None:
        try:
            with httpx2.stream(
                "GET",
                server.stream_url(run_id),
                params=params,
                headers={"Authorization": f"Bearer {server.token}", **(headers or {})},
                timeout=httpx2.Timeout(30.0),
            ) as response:
                assert response.status_code == 200, response.read()
                assert response.headers["content-type"].startswith("text/event-stream")
                _read(response, received)
        finally:
            received.done.set()

    threading.Thread(target=read, daemon=True).start()
    return received


def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the wake-up hub is PostgreSQL's (on SQLite streams keep the short poll)")


def _claimed(run_id: uuid.UUID) -> Lease:
    [claim] = run_claim(owner="stream-worker", lease_seconds=300, run_id=run_id)
    return claim.lease


def _model_step(lease: Lease, n: int) -> int:
    return step_record(
        lease,
        role="leader",
        invocation="leader-1",
        kind="model",
        name="model-x",
        request={"messages": n},
        response={"content": f"answer {n}"},
        tokens_in=100 * n,
        tokens_out=10 * n,
        cost=0.01 * n,
        duration_ms=5,
    )


def _finish(lease: Lease) -> None:
    run_id = lease.run_id
    if LoopRun.objects.get(pk=run_id).status == RunStatus.PREPARING:  # SQLite claims into it
        run_transition(run_id=run_id, to=RunStatus.RUNNING, actor="stream-worker", lease=lease)
    run_transition(run_id=run_id, to=RunStatus.VERIFYING, actor="stream-worker", lease=lease)
    run_transition(
        run_id=run_id,
        to=RunStatus.SUCCEEDED,
        actor="stream-worker",
        lease=lease,
        fields={"terminal_reason": "verified"},
    )


def test_a_run_is_streamed_as_events_steps_and_its_end(asgi_server: Server) -> None:
    run = make_run(make_pattern())
    received = follow(asgi_server, run.id)
    received.wait_for(lambda r: bool(r.of("run")))
    lease = _claimed(run.id)
    _model_step(lease, 1)
    _model_step(lease, 2)
    _finish(lease)
    assert received.done.wait(20), received.messages

    events = received.of("event")
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert received.ids("event") == [str(e["seq"]) for e in events]
    assert events[0]["type"] == "run.created" and events[-1]["to_status"] == "succeeded"
    steps = received.of("step")
    assert [(s["seq"], s["role"], s["kind"], s["name"]) for s in steps] == [
        (1, "leader", "model", "model-x"),
        (2, "leader", "model", "model-x"),
    ]
    assert [(s["tokens_in"], s["tokens_out"], s["cost"]) for s in steps] == [
        (100, 10, "0.010000"),
        (200, 20, "0.020000"),
    ]
    assert received.of("run")[-1]["status"] == "succeeded"
    [done] = received.of("done")
    assert done == {"status": "succeeded"} and received.messages[-1][0] == "done"
    assert received.messages[-1][1] == str(events[-1]["seq"])


def test_last_event_id_resumes_exactly_after_the_event_it_names(asgi_server: Server) -> None:
    run = make_run(make_pattern())
    lease = _claimed(run.id)
    for n in range(5):
        run_event_append(run_id=run.id, type="note", actor="t", data={"n": n}, lease=lease)
    _finish(lease)
    full = follow(asgi_server, run.id)
    assert full.done.wait(20)
    seqs = [e["seq"] for e in full.of("event")]
    resumed = follow(asgi_server, run.id, headers={"Last-Event-ID": str(seqs[3])})
    assert resumed.done.wait(20)
    assert [e["seq"] for e in resumed.of("event")] == seqs[4:]
    by_param = follow(asgi_server, run.id, after_seq=seqs[-2])
    assert by_param.done.wait(20)
    assert [e["seq"] for e in by_param.of("event")] == seqs[-1:]


def test_a_parked_run_lists_its_pending_approvals_and_heartbeats_keep_the_stream_open(
    asgi_server: Server, stream_settings: dict[str, float]
) -> None:
    stream_settings.update(SSE_MAX_SECONDS=1.5)
    run = make_run(make_pattern(), status=RunStatus.WAITING_APPROVAL)
    received = follow(asgi_server, run.id)
    assert received.done.wait(20)
    assert received.comments >= 2
    [state] = received.of("run")
    assert state["status"] == "waiting_approval" and state["pending_approvals"] == []
    assert not received.of("done") and received.messages[-1][:2] == ("bye", "1")


def test_refusals_are_problems_and_need_a_token(asgi_server: Server) -> None:
    headers = {"Authorization": f"Bearer {asgi_server.token}"}
    missing = httpx2.get(asgi_server.stream_url(uuid.uuid4()), headers=headers)
    assert missing.status_code == 404
    assert missing.headers["content-type"].startswith("application/problem+json")
    bad = httpx2.get(asgi_server.stream_url("not-a-uuid"), headers=headers)
    assert bad.status_code == 400 and bad.json()["errors"][0]["pointer"] == "/id"
    run = make_run(make_pattern())
    assert httpx2.get(asgi_server.stream_url(run.id)).status_code == 401
    negative = httpx2.get(asgi_server.stream_url(run.id), params={"after_seq": -1}, headers=headers)
    assert negative.status_code == 400


@pytest.mark.postgres
def test_a_write_wakes_the_stream_long_before_any_poll(
    asgi_server: Server, stream_settings: dict[str, float]
) -> None:
    """The poll and the safety poll are 60 s away: only the hub's wake-up can bring the events
    within the test's 20 s."""
    _postgres_only()
    stream_settings.update(SSE_POLL_SECONDS=60.0, SSE_SAFETY_POLL_SECONDS=60.0)
    run = make_run(make_pattern())
    received = follow(asgi_server, run.id)
    received.wait_for(lambda r: bool(r.of("run")))
    hub = wakeups.hub()
    assert hub is not None and hub.wait_listening(10)
    lease = _claimed(run.id)
    _model_step(lease, 1)
    received.wait_for(lambda r: bool(r.of("step")))
    _finish(lease)
    assert received.done.wait(20), received.messages
    assert [s["seq"] for s in received.of("step")] == [1]
    assert received.of("done") == [{"status": "succeeded"}]


@pytest.mark.postgres
def test_streams_of_one_run_share_one_read_per_wake_up(
    asgi_server: Server, stream_settings: dict[str, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    _postgres_only()
    stream_settings.update(SSE_POLL_SECONDS=60.0, SSE_SAFETY_POLL_SECONDS=60.0)
    reads: list[uuid.UUID] = []
    original = api_streams.RunTail._read

    def counted(tail: api_streams.RunTail) -> None:
        reads.append(tail.run_id)
        original(tail)

    monkeypatch.setattr(api_streams.RunTail, "_read", counted)
    run = make_run(make_pattern())
    streams = [follow(asgi_server, run.id) for _ in range(8)]
    for received in streams:
        received.wait_for(lambda r: bool(r.of("run")))
    before = len(reads)
    lease = _claimed(run.id)
    for received in streams:
        received.wait_for(lambda r: any(e["type"] == "lease.claimed" for e in r.of("event")))
    assert 1 <= len(reads) - before <= 2  # one read per wake-up (two if they straddle a read)
    _finish(lease)
    for received in streams:
        assert received.done.wait(20)
        assert [e["seq"] for e in received.of("event")] == [
            e["seq"] for e in streams[0].of("event")
        ]

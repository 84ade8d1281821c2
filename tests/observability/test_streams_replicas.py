"""Live updates across web replicas: two production web processes (uvicorn, each with its own
wake-up hub) on one PostgreSQL. A client streams from replica A while an operator acts through
replica B; A's streams hear of it from PostgreSQL ``LISTEN/NOTIFY`` at once, although their polls
are a minute away (``tests.support.replica_settings``). Covers the API's run stream and the
UI's monitor stream (docs/operations.md: several web replicas)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
from django.db import connection
from django.test import Client

from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import api_token_create, user_ensure
from tests.support import workers
from tests.support.chaos import ManagedProcess, free_port
from tests.support.factories import make_pattern, make_run
from tests.support.workers import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

#: Well under the replicas' 60 s polls: only a cross-process wake-up is this fast.
WITHIN_SECONDS = 10.0


@dataclass
class Replica:
    url: str
    process: ManagedProcess


@dataclass
class Stream:
    """Messages (event, data, monotonic time) read by a thread from one SSE response."""

    messages: list[tuple[str, Any, float]] = field(default_factory=list)

    def of(self, event: str) -> list[Any]:
        return [data for kind, data, _ in self.messages if kind == event]


def _replica(name: str, tmp_path: Path) -> Replica:
    port = free_port()
    argv = [
        sys.executable, "-m", "uvicorn", "orchestrator.asgi:application", "--host", "127.0.0.1",
        "--port", str(port), "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip
    env = {
        **os.environ,
        "DATABASE_URL": workers.test_database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.support.replica_settings",
    }
    process = ManagedProcess(name, argv, tmp_path / f"{name}.log", env).start()
    replica = Replica(f"http://127.0.0.1:{port}", process)

    def ready() -> bool:
        assert process.alive(), process.log()[-3000:]
        try:
            return httpx2.get(f"{replica.url}/readyz", timeout=2).status_code == 200
        except httpx2.TransportError:
            return False

    wait_for(ready, timeout=60, interval=0.2, message=f"{name} not ready")
    return replica


@pytest.fixture
def replicas(seeded_profiles: None, tmp_path: Path) -> Iterator[tuple[Replica, Replica]]:
    if connection.vendor != "postgresql":
        pytest.skip("replicas share a PostgreSQL server; the embedded default runs one process")
    started: list[Replica] = []
    try:
        started += [_replica("replica-a", tmp_path), _replica("replica-b", tmp_path)]
        yield started[0], started[1]
    finally:
        for replica in started:
            replica.process.kill()


def _follow(url: str, **request: Any) -> Stream:
    stream = Stream()

    def read() -> None:
        with contextlib.suppress(httpx2.HTTPError):  # the replica stops at the test's end
            _read(url, stream, **request)

    threading.Thread(target=read, daemon=True).start()
    return stream


def _read(url: str, stream: Stream, **request: Any) -> None:
    event, data = "message", ""
    with httpx2.stream("GET", url, timeout=70, **request) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line:
                if data:
                    stream.messages.append((event, json.loads(data), time.monotonic()))
                event, data = "message", ""
            elif line.startswith("event:"):
                event = line.partition(":")[2].strip()
            elif line.startswith("data:"):
                data += line.partition(":")[2].strip()


def _cancel(replica: Replica, token: str, run_id: uuid.UUID) -> float:
    response = httpx2.post(
        f"{replica.url}/api/v1/runs/{run_id}/cancel",
        headers={"Authorization": f"Bearer {token}"},
        json={"reason": "from the other replica"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    return time.monotonic()


def test_a_run_stream_on_one_replica_hears_an_action_taken_on_another(
    replicas: tuple[Replica, Replica],
) -> None:
    a, b = replicas
    token = api_token_create(user=user_ensure(username="ops", roles=[Role.OPERATOR]))
    run = make_run(make_pattern())
    stream = _follow(
        f"{a.url}/api/v1/runs/{run.id}/stream", headers={"Authorization": f"Bearer {token}"}
    )
    wait_for(lambda: bool(stream.of("run")), timeout=WITHIN_SECONDS, message=str(stream))
    time.sleep(1.0)  # replica A's hub is listening by now (it opened before the first read)
    sent = _cancel(b, token, run.id)
    wait_for(lambda: bool(stream.of("done")), timeout=WITHIN_SECONDS, message=str(stream))
    types = [e["type"] for e in stream.of("event")]
    assert "run.canceled" in types, types
    assert stream.of("done") == [{"status": "canceled"}]
    arrived = next(t for kind, _, t in stream.messages if kind == "done")
    print(f"cancel on B reached a stream on A {1000 * (arrived - sent):.0f} ms after B answered")


def test_the_monitor_on_one_replica_shows_a_run_changed_through_another(
    replicas: tuple[Replica, Replica],
) -> None:
    a, b = replicas
    user = user_ensure(username="watch", roles=[Role.OPERATOR])
    token = api_token_create(user=user)
    browser = Client()
    browser.force_login(user)
    cookies = {"sessionid": browser.cookies["sessionid"].value}
    pattern = make_pattern()
    run = make_run(pattern)
    stream = _follow(f"{a.url}/ui/stream/runs", cookies=cookies)
    wait_for(lambda: bool(stream.messages), timeout=WITHIN_SECONDS, message=str(stream))
    time.sleep(1.0)
    _cancel(b, token, run.id)
    wait_for(
        lambda: any(str(run.id) in json.dumps(data) for data in stream.of("run")),
        timeout=WITHIN_SECONDS,
        message=str(stream.messages),
    )

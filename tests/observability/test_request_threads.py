"""The production web process (uvicorn serving ``orchestrator.asgi``) keeps its database
connections between requests (``orchestrator.request_threads``): a hundred API requests in a
row open at most its request threads' connections, not one each; live streams held open, more
of them than there are threads, neither close those connections nor hold other requests up."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from django.db import connection

from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import api_token_create, user_ensure
from orchestrator.request_threads import REQUEST_THREADS
from tests.support import workers
from tests.support.chaos import ManagedProcess, free_port
from tests.support.factories import make_pattern, make_run
from tests.support.workers import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

#: Unique to this test process: tests on other xdist workers run web processes of their own.
APP_NAME = f"lw-request-threads-test-{os.getpid()}"


@pytest.fixture
def web(tmp_path: Path) -> Iterator[str]:
    if connection.vendor != "postgresql":
        pytest.skip("counts PostgreSQL backends; SQLite has no connections to count")
    port = free_port()
    argv = [
        sys.executable, "-m", "uvicorn", "orchestrator.asgi:application", "--host", "127.0.0.1",
        "--port", str(port), "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip
    url = workers.test_database_url()
    separator = "&" if "?" in url else "?"
    env = {
        **os.environ,
        # The web process's backends are told apart by their application_name.
        "DATABASE_URL": f"{url}{separator}application_name={APP_NAME}",
        "DJANGO_SETTINGS_MODULE": "tests.support.replica_settings",
    }
    process = ManagedProcess("web", argv, tmp_path / "web.log", env).start()
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert process.alive(), process.log()[-3000:]
        try:
            return httpx2.get(f"{base}/healthz", timeout=2).status_code == 200
        except httpx2.TransportError:
            return False

    try:
        wait_for(ready, timeout=60, interval=0.2, message="web not ready")
        yield base
    finally:
        process.kill()


def _backends() -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", [APP_NAME])
        return {row[0] for row in cursor.fetchall()}


def _token() -> str:
    user = user_ensure(username="threads-viewer", roles=[Role.VIEWER])
    return str(api_token_create(user=user, name="threads"))


class TestRequestThreadsKeepConnections:
    def test_a_hundred_requests_reuse_the_threads_connections(self, web: str) -> None:
        headers = {"Authorization": f"Bearer {_token()}"}
        seen: set[int] = set()
        with httpx2.Client(base_url=web, headers=headers, timeout=10) as client:
            for n in range(100):
                path = "/healthz" if n % 2 else "/api/v1/runs?limit=5"
                assert client.get(path).status_code == 200
                seen |= _backends()
        # Django's own handler opens a connection per request (a hundred backends here).
        assert 1 <= len(seen) <= REQUEST_THREADS, seen

    def test_open_streams_hold_neither_requests_nor_connections(self, web: str) -> None:
        headers = {"Authorization": f"Bearer {_token()}"}
        run = make_run(make_pattern(key="threads-streams"))  # queued: its stream stays open
        stop = threading.Event()

        def follow() -> None:
            url = f"{web}/api/v1/runs/{run.id}/stream"
            with (
                contextlib.suppress(httpx2.HTTPError),
                httpx2.stream("GET", url, headers=headers, timeout=70) as response,
            ):
                for _ in response.iter_lines():
                    if stop.is_set():
                        return

        streams = [threading.Thread(target=follow, daemon=True) for _ in range(REQUEST_THREADS + 2)]
        for thread in streams:
            thread.start()
        try:
            time.sleep(2)  # every stream open, its first read and heartbeats done
            with httpx2.Client(base_url=web, headers=headers, timeout=10) as client:
                started = time.monotonic()
                for _ in range(20):
                    assert client.get("/api/v1/runs?limit=5").status_code == 200
                took = time.monotonic() - started
            assert took < 5, f"20 requests beside {len(streams)} streams took {took:.1f} s"
            assert len(_backends()) <= REQUEST_THREADS
        finally:
            stop.set()

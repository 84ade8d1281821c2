"""The web's Django handler (``orchestrator.request_threads``) through its ASGI interface: a
plain response's sync work (``request_started``, the view, the response's close and its
``request_finished``) runs in one hop to the request's thread; a streamed response is sent
whole, then closed, as Django does."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core import signals
from django.db import connections

from orchestrator.request_threads import PooledThreadsASGIHandler

pytestmark = pytest.mark.django_db(transaction=True)


def _scope(path: str) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }


def _get(handler: PooledThreadsASGIHandler, path: str) -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []
    asked: list[bool] = []

    async def receive() -> dict[str, Any]:
        if not asked:
            asked.append(True)
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(handler(_scope(path), receive, send))
    [start] = [m for m in sent if m["type"] == "http.response.start"]
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return int(start["status"]), body


@pytest.fixture
def handler() -> Iterator[PooledThreadsASGIHandler]:
    handler = PooledThreadsASGIHandler(threads=1)
    yield handler
    for executor in handler.threads.executors:  # each request thread closes its connection
        executor.submit(connections.close_all).result(timeout=10)
        executor.shutdown()


@pytest.fixture
def signalled() -> Iterator[list[tuple[str, str]]]:
    """(signal, thread name) of each request signal, in order."""
    seen: list[tuple[str, str]] = []

    def started(**_: Any) -> None:
        seen.append(("started", threading.current_thread().name))

    def finished(**_: Any) -> None:
        seen.append(("finished", threading.current_thread().name))

    signals.request_started.connect(started)
    signals.request_finished.connect(finished)
    yield seen
    signals.request_started.disconnect(started)
    signals.request_finished.disconnect(finished)


def _hops(handler: PooledThreadsASGIHandler) -> list[str]:
    """Count what is submitted to the request threads (each submission is a hop)."""
    submitted: list[str] = []
    for executor in handler.threads.executors:
        original = executor.submit

        def counted(fn: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            submitted.append(getattr(fn, "__name__", repr(fn)))
            return _original(fn, *args, **kwargs)

        executor.submit = counted  # type: ignore[method-assign]
    return submitted


def test_a_plain_response_is_one_hop_with_both_request_signals_on_the_request_thread(
    handler: PooledThreadsASGIHandler, signalled: list[tuple[str, str]]
) -> None:
    hops = _hops(handler)
    status, body = _get(handler, "/healthz")
    assert status == 200 and body
    assert len(hops) == 1
    assert [name for name, _ in signalled] == ["started", "finished"]
    assert {thread for _, thread in signalled} == {"web-request-0_0"}


# A static file's response streams a sync iterator (WhiteNoise in the sync chain): Django warns.
@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume synchronous iterators")
def test_a_streamed_response_is_sent_whole_then_closed(
    handler: PooledThreadsASGIHandler, signalled: list[tuple[str, str]]
) -> None:
    static = Path(__file__).resolve().parents[2] / "frontend/static/frontend/app.css"
    status, body = _get(handler, "/static/frontend/app.css")
    assert status == 200 and body == static.read_bytes()
    assert [name for name, _ in signalled] == ["started", "finished"]


def test_an_error_response_still_goes_out_in_one_hop(
    handler: PooledThreadsASGIHandler, signalled: list[tuple[str, str]]
) -> None:
    hops = _hops(handler)
    status, _ = _get(handler, "/api/v1/runs/not-a-run")  # no credentials: refused
    assert status in (401, 403)
    assert len(hops) == 1 and [name for name, _ in signalled] == ["started", "finished"]

"""An ASGI app served by uvicorn on loopback in a daemon thread, for tests that call it over
real HTTP."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn


@contextlib.contextmanager
def uvicorn_thread(app: Any, *, start_seconds: float = 30.0) -> Iterator[str]:
    """``http://127.0.0.1:<port>``: ``app`` under uvicorn (lifespan on) until the block ends."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    instance = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=instance.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_seconds
    while not instance.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        instance.should_exit = True
        thread.join(timeout=30)
        sock.close()

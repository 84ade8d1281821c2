"""Loopback listeners for the outbound-guard tests (docs/reliability.md P3).

:class:`Canary` listens on 127.0.0.1 and ::1 on one port, records every connection it accepts
and answers each request with a small OpenAI-style completion (so an allowed model call or
webhook succeeds). A refused URL must leave its ``connections`` empty: the guard refuses before
connecting. :class:`Redirector` answers every request with a ``302`` to a given location.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

COMPLETION = json.dumps(
    {
        "id": "canary",
        "object": "chat.completion",
        "model": "canary",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "canary"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()  # fmt: skip


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], family: int, owner: Any) -> None:
        self.address_family = family
        self.owner = owner
        super().__init__(address, owner.handler)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self.owner.lock:
            self.owner.connections.append(str(client_address[0]))
        return True


class _Reply(BaseHTTPRequestHandler):
    server: _Server

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        owner = self.server.owner
        with owner.lock:
            owner.requests.append(self.path)
        status, headers, body = owner.reply(self.path)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Canary:
    """One port on 127.0.0.1 and ::1; ``connections`` lists the peers of accepted connections."""

    handler = _Reply

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.connections: list[str] = []
        self.requests: list[str] = []
        self.servers = self._bind()
        self.port = int(self.servers[0].server_address[1])
        self.threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in self.servers]

    def _bind(self) -> list[_Server]:
        for _ in range(50):
            v6 = _Server(("::1", 0), socket.AF_INET6, self)
            try:
                v4 = _Server(("127.0.0.1", int(v6.server_address[1])), socket.AF_INET, self)
            except OSError:
                v6.server_close()
                continue
            return [v4, v6]
        raise RuntimeError("no port free on both 127.0.0.1 and ::1")

    def reply(self, path: str) -> tuple[int, dict[str, str], bytes]:
        return 200, {"Content-Type": "application/json"}, COMPLETION

    def url(self, path: str = "/v1") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def hits(self) -> int:
        with self.lock:
            return len(self.connections)

    def __enter__(self) -> Canary:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()
        for thread in self.threads:
            thread.join(5)


class Redirector(Canary):
    """Answers every request with ``302 Location: <location>``."""

    def __init__(self, location: str = "") -> None:
        super().__init__()
        self.location = location

    def reply(self, path: str) -> tuple[int, dict[str, str], bytes]:
        return 302, {"Location": self.location}, b""

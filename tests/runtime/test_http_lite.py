"""``http_lite``: the run driver's keep-alive client for plain JSON model calls, over real
loopback sockets (a small asyncio HTTP server per test; the model client's own behaviour over
it is tested in test_model_client.py with both transports)."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from runtime import http_lite
from runtime.model_pool import ssl_context
from runtime.outbound import OutboundPolicy, OutboundRefused, ResponseTooLarge

pytestmark = pytest.mark.anyio

Reply = Callable[[bytes], bytes]


def plain(body: bytes, status: str = "200 OK", extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


@dataclass
class Server:
    reply: Reply
    #: Close each connection this long after answering on it (None: keep it open).
    close_after: float | None = None
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                writer.write(self.reply(body))
                await writer.drain()
                if self.close_after is not None:
                    await asyncio.sleep(self.close_after)
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"


Serve = Callable[..., Awaitable[Server]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start servers that answer with ``reply``; all are stopped after the test."""
    servers: list[asyncio.Server] = []

    async def start(reply: Reply, *, close_after: float | None = None) -> Server:
        state = Server(reply, close_after=close_after)
        server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
        state.port = server.sockets[0].getsockname()[1]
        servers.append(server)
        return state

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


def echo(body: bytes) -> bytes:
    return plain(json.dumps({"got": json.loads(body)}).encode())


async def test_calls_reuse_one_kept_alive_connection(serve: Serve) -> None:
    server = await serve(echo)
    pool = http_lite.Pool(ssl_context())
    try:
        for n in range(5):
            answer = await pool.post_json(
                server.url, {"n": n, "text": "é"}, {"Authorization": "Bearer k"}, connect_timeout=5
            )
            assert answer.status_code == 200 and answer.json() == {"got": {"n": n, "text": "é"}}
    finally:
        await pool.close()
    assert server.connections == 1
    head = server.requests[0].split(b"\r\n\r\n")[0].decode()
    assert f"Host: 127.0.0.1:{server.port}" in head and "Authorization: Bearer k" in head
    assert head.startswith("POST /v1/chat/completions HTTP/1.1")


async def test_a_connection_the_server_ended_while_idle_is_replaced(
    serve: Serve,
) -> None:
    server = await serve(echo, close_after=0.0)
    pool = http_lite.Pool(ssl_context())
    try:
        first = await pool.post_json(server.url, {"n": 1}, {}, connect_timeout=5)
        await asyncio.sleep(0.05)  # the server has closed it by now
        second = await pool.post_json(server.url, {"n": 2}, {}, connect_timeout=5)
    finally:
        await pool.close()
    assert first.json() == {"got": {"n": 1}} and second.json() == {"got": {"n": 2}}
    assert server.connections == 2


async def test_chunked_and_compressed_answers_are_read_whole(serve: Serve) -> None:
    def chunked(_: bytes) -> bytes:
        parts = [b'{"a": ', b'"xyz"', b"}"]
        body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
        return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body

    def gzipped(_: bytes) -> bytes:
        return plain(gzip.compress(b'{"z": 1}'), extra="Content-Encoding: gzip\r\n")

    pool = http_lite.Pool(ssl_context())
    try:
        for reply, expected in ((chunked, {"a": "xyz"}), (gzipped, {"z": 1})):
            server = await serve(reply)
            answer = await pool.post_json(server.url, {}, {}, connect_timeout=5)
            assert answer.json() == expected
    finally:
        await pool.close()


async def test_an_error_status_comes_back_with_its_headers(serve: Serve) -> None:
    def limited(_: bytes) -> bytes:
        return plain(b'{"error": "slow down"}', "429 Too Many Requests", "Retry-After: 3\r\n")

    server = await serve(limited)
    pool = http_lite.Pool(ssl_context())
    try:
        answer = await pool.post_json(server.url, {}, {}, connect_timeout=5)
    finally:
        await pool.close()
    assert answer.status_code == 429 and answer.headers["retry-after"] == "3"
    assert "slow down" in answer.text


async def test_a_refused_connection_and_a_bad_url_fail_clearly() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pool = http_lite.Pool(ssl_context())
    with pytest.raises(http_lite.HttpError, match=r"Connect|refused"):
        await pool.post_json(f"http://127.0.0.1:{port}/v1", {}, {}, connect_timeout=2)
    with pytest.raises(http_lite.BadUrl, match="expected http"):
        await pool.post_json("ftp://example.org/v1", {}, {}, connect_timeout=2)
    await pool.close()


async def test_proxy_variables_do_not_divert_calls(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard checks the address it connects to; a proxy would connect somewhere else."""
    server, proxy = await serve(echo), await serve(echo)
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.port}")
    pool = http_lite.Pool(ssl_context())
    try:
        answer = await pool.post_json(server.url, {"n": 1}, {}, connect_timeout=5)
    finally:
        await pool.close()
    assert answer.json() == {"got": {"n": 1}}
    assert (server.connections, proxy.connections) == (1, 0)


async def test_an_address_the_policy_refuses_is_never_connected(serve: Serve) -> None:
    server = await serve(echo)
    deny = OutboundPolicy(private="deny")
    pool = http_lite.Pool(ssl_context())
    try:
        with pytest.raises(OutboundRefused, match="LOOPWRIGHT_OUTBOUND_PRIVATE=deny"):
            await pool.post_json(server.url, {}, {}, connect_timeout=5, policy=deny)
        allowed = await pool.post_json(
            server.url, {}, {}, connect_timeout=5, policy=OutboundPolicy()
        )
        # A kept-alive connection belongs to the policy that checked it: deny still refuses.
        with pytest.raises(OutboundRefused):
            await pool.post_json(server.url, {}, {}, connect_timeout=5, policy=deny)
    finally:
        await pool.close()
    assert allowed.status_code == 200 and server.connections == 1


async def test_bodies_stop_at_the_size_cap_compressed_or_not(serve: Serve) -> None:
    def bomb(_: bytes) -> bytes:  # 64 KiB on the wire, 64 MiB decoded
        return plain(gzip.compress(b"0" * 2**26), extra="Content-Encoding: gzip\r\n")

    def big(_: bytes) -> bytes:
        return plain(b"x" * 5000)

    capped = OutboundPolicy(max_body_bytes=4096)
    pool = http_lite.Pool(ssl_context())
    try:
        for reply in (bomb, big):
            server = await serve(reply)
            with pytest.raises(ResponseTooLarge, match="larger than 4096 bytes"):
                await pool.post_json(server.url, {}, {}, connect_timeout=5, policy=capped)
    finally:
        await pool.close()

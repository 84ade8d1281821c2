"""A small HTTP/1.1 client for the run driver's non-streaming model calls.

One request shape: ``POST`` a JSON body, read the whole answer. Connections are kept alive per
origin (scheme, host, port) on the event loop that made them; the protocol itself (framing,
``Content-Length`` or chunked bodies, keep-alive rules) is ``h11``'s, the library httpx's own
HTTP/1.1 transport is built on. What it leaves out is httpx's generality (auth flows, redirects,
cookies, proxies, HTTP/2, the transport and pool layers over anyio; ``docs/performance.md`` says
why). The model client uses it only where that generality is not needed: a pooled event loop,
an ``http``/``https`` URL.

Every new connection goes through the outbound guard (``runtime/outbound.py``):
the host is resolved, every address checked against the policy, and the connection made to a
checked address (TLS keeps the host name for SNI and certificate checks, ``Host`` keeps it
too). Kept-alive connections are keyed by the policy that checked them and reused without a new
lookup. Bodies are capped at the policy's ``max_body_bytes`` (decoded).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import h11

from runtime import outbound
from runtime.outbound import OutboundPolicy, ResponseTooLarge

#: Idle keep-alive connections kept per origin.
IDLE_PER_ORIGIN = 256
_CHUNK = 65536
Origin = tuple[str, str, int]


class HttpError(Exception):
    """The request could not be made or its answer not read (connection refused or reset,
    a protocol violation). Nothing is known about whether the server acted on it."""


class _Unanswered(HttpError):
    """The connection ended before any byte of an answer came back."""


class BadUrl(Exception):
    """The URL is not one this client can call (its scheme, or no host)."""


@dataclass(frozen=True)
class Response:
    """What the model client reads of an answer (the attributes it reads of httpx's)."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    protocol: h11.Connection

    def reusable(self) -> bool:
        return not (self.reader.at_eof() or self.writer.is_closing())

    def close(self) -> None:
        self.writer.close()


class Pool:
    """Keep-alive connections of one event loop, per origin; ``close`` ends them all."""

    def __init__(self, ssl_context: ssl.SSLContext) -> None:
        self.ssl_context = ssl_context
        self.idle: dict[tuple[Origin, OutboundPolicy], list[_Connection]] = {}
        self.closed = False

    async def post_json(
        self,
        url: str,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
        *,
        connect_timeout: float,
        policy: OutboundPolicy | None = None,
    ) -> Response:
        """POST ``body`` as JSON and read the whole answer. The caller bounds the total time
        (``asyncio.timeout``); a cancelled call closes its connection. A new connection is made
        only to an address ``policy`` (default: the process-wide one) allows, else
        :class:`outbound.OutboundRefused`."""
        policy = policy or outbound.current_policy()
        origin, target, host_header = _origin(url)
        key = (origin, policy)
        payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        request = h11.Request(
            method="POST",
            target=target,
            headers=[
                ("Host", host_header),
                ("User-Agent", "loopwright"),
                ("Accept", "application/json"),
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(payload))),
                *headers.items(),
            ],
        )
        connection = self._idle_connection(key)
        if connection is not None:
            try:
                return await self._send(key, connection, request, payload)
            except _Unanswered:
                pass  # a kept-alive connection the server had ended: once more, on a new one
        connection = await self._connect(origin, connect_timeout, policy)
        try:
            return await self._send(key, connection, request, payload)
        except _Unanswered as exc:
            raise HttpError(str(exc)) from None

    async def _send(
        self,
        key: tuple[Origin, OutboundPolicy],
        connection: _Connection,
        request: h11.Request,
        payload: bytes,
    ) -> Response:
        done = False
        try:
            response = await _exchange(connection, request, payload, key[1].max_body_bytes)
            done = True
        except (OSError, h11.ProtocolError, zlib.error) as exc:
            raise HttpError(f"{type(exc).__name__}: {exc}") from None
        finally:
            if not done:
                connection.close()
        self._release(key, connection)
        return response

    def _idle_connection(self, key: tuple[Origin, OutboundPolicy]) -> _Connection | None:
        idle = self.idle.get(key)
        while idle:
            connection = idle.pop()
            if connection.reusable():
                return connection
            connection.close()  # the server ended it while it was idle
        return None

    async def _connect(self, origin: Origin, timeout: float, policy: OutboundPolicy) -> _Connection:
        """A new connection to a checked address of the origin's host (the guard's rules)."""
        scheme, host, port = origin
        outbound.check_scheme(scheme, policy)
        context = self.ssl_context if scheme == "https" else None
        failure = ""
        try:
            async with asyncio.timeout(timeout):
                for address in await outbound.resolve_checked_async(host, port, policy):
                    try:
                        reader, writer = await asyncio.open_connection(
                            address, port, ssl=context, server_hostname=host if context else None
                        )
                    except OSError as exc:
                        failure = f"{type(exc).__name__}: {exc}"
                        continue
                    return _Connection(reader, writer, h11.Connection(h11.CLIENT))
        except TimeoutError:
            raise HttpError(f"connecting to {host}:{port} timed out after {timeout:g}s") from None
        except OSError as exc:
            raise HttpError(f"{type(exc).__name__}: {exc}") from None
        raise HttpError(failure or f"no address of {host} answered")

    def _release(self, key: tuple[Origin, OutboundPolicy], connection: _Connection) -> None:
        protocol = connection.protocol
        if protocol.our_state is h11.DONE and protocol.their_state is h11.DONE:
            protocol.start_next_cycle()
            idle = self.idle.setdefault(key, [])
            if not self.closed and len(idle) < IDLE_PER_ORIGIN and connection.reusable():
                idle.append(connection)
                return
        connection.close()

    async def close(self) -> None:
        self.closed = True
        idle, self.idle = self.idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()
        for connections in idle.values():
            for connection in connections:
                with contextlib.suppress(OSError, ssl.SSLError):
                    await connection.writer.wait_closed()


def _origin(url: str) -> tuple[Origin, str, str]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise BadUrl(f"unsupported URL {url!r}: expected http:// or https:// and a host")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError as exc:
        raise BadUrl(f"invalid port in {url!r}: {exc}") from None
    default = port == (443 if scheme == "https" else 80)
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if default else f"{shown}:{port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return (scheme, host, port), target, host_header


async def _exchange(
    connection: _Connection, request: h11.Request, payload: bytes, limit: int
) -> Response:
    protocol, reader, writer = connection.protocol, connection.reader, connection.writer
    data = protocol.send(request) or b""
    data += protocol.send(h11.Data(data=payload)) or b""
    data += protocol.send(h11.EndOfMessage()) or b""
    try:
        writer.write(data)
        await writer.drain()
    except ConnectionError as exc:
        raise _Unanswered(f"{type(exc).__name__}: {exc}") from None
    status, headers, body = 0, {}, bytearray()
    while True:
        event = protocol.next_event()
        if event is h11.NEED_DATA:
            await _read_more(reader, protocol, answered=status != 0)
            continue
        if isinstance(event, h11.InformationalResponse):
            continue
        if isinstance(event, h11.Response):
            status = event.status_code
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > limit:
                raise ResponseTooLarge(limit)
        elif isinstance(event, h11.EndOfMessage):
            break
        elif isinstance(event, h11.ConnectionClosed):
            raise HttpError("the server closed the connection before answering")
    encoding = headers.get("content-encoding", "")
    return Response(status, headers, _decoded(bytes(body), encoding, limit))


async def _read_more(
    reader: asyncio.StreamReader, protocol: h11.Connection, *, answered: bool
) -> None:
    try:
        chunk = await reader.read(_CHUNK)
    except ConnectionError as exc:
        if not answered:
            raise _Unanswered(f"{type(exc).__name__}: {exc}") from None
        raise
    if not chunk and not answered:
        raise _Unanswered("the server closed the connection before answering")
    protocol.receive_data(chunk)  # b"" is the end of the stream (h11 judges it)


def _decoded(body: bytes, encoding: str, limit: int) -> bytes:
    """The body as sent, undoing a ``Content-Encoding`` a server applied unasked; at most
    ``limit`` decoded bytes (a compressed bomb stops there)."""
    encoding = encoding.strip().lower()
    if encoding in ("gzip", "deflate"):
        return outbound.Inflater(encoding, limit).feed(body)
    return body

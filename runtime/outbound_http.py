"""The outbound guard applied to ``httpx2``: a network backend that resolves, checks and
connects to the checked address, and transports that add the size cap and total timeout.

httpx2 builds its connections through ``httpcore2``; an ``httpcore2`` connection pool takes a
``network_backend`` whose ``connect_tcp(host, port)`` opens every new connection. The guarded
backends (:class:`GuardedAsyncBackend`, :class:`GuardedBackend`) resolve ``host`` with the
policy's resolver, check every address (:func:`outbound.resolve_checked`) and connect to the
checked address; TLS still gets ``host`` as its server name (httpcore passes it to
``start_tls``) and the request keeps ``Host: host``. A kept-alive connection is reused without
a new check (it was checked when it was made); a redirect to another origin is a new connection,
so a client that follows redirects has every hop checked.

The transports also pin ``Accept-Encoding`` to ``gzip, deflate`` and decode those themselves
with the policy's cap on decoded bytes (a compressed bomb stops at the cap), refuse other
encodings, and ignore proxy variables (the guard must see the address it connects to).
"""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
import zlib
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import httpcore2
import httpx2

from runtime import outbound
from runtime.outbound import (
    Inflater,
    OutboundPolicy,
    OutboundRefused,
    ResponseTooLarge,
)

_ENCODINGS = "gzip, deflate"


class GuardedAsyncBackend(httpcore2.AsyncNetworkBackend):
    """Every new connection: resolve, check each address, connect to a checked address."""

    def __init__(self, policy: OutboundPolicy) -> None:
        self.policy = policy
        self._inner = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        deadline = time.monotonic() + timeout if timeout is not None else None
        try:
            addresses = await outbound.resolve_checked_async(
                host, port, self.policy, timeout=timeout
            )
        except TimeoutError:
            raise httpcore2.ConnectTimeout(f"resolving {host} timed out") from None
        except OSError as exc:
            raise httpcore2.ConnectError(f"{type(exc).__name__}: {exc}") from None
        failure: Exception = httpcore2.ConnectError(f"no address of {host} answered")
        for address in addresses:
            left = None if deadline is None else max(0.001, deadline - time.monotonic())
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout=left, local_address=local_address,
                    socket_options=socket_options,
                )  # fmt: skip
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                failure = exc
        raise failure

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore2.AsyncNetworkStream:
        raise OutboundRefused("url", "Unix sockets are not outbound targets")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class GuardedBackend(httpcore2.NetworkBackend):
    """:class:`GuardedAsyncBackend` for synchronous clients."""

    def __init__(self, policy: OutboundPolicy) -> None:
        self.policy = policy
        self._inner = httpcore2.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.NetworkStream:
        try:
            addresses = outbound.resolve_checked(host, port, self.policy)
        except OSError as exc:
            raise httpcore2.ConnectError(f"{type(exc).__name__}: {exc}") from None
        failure: Exception = httpcore2.ConnectError(f"no address of {host} answered")
        for address in addresses:
            try:
                return self._inner.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address,
                    socket_options=socket_options,
                )  # fmt: skip
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                failure = exc
        raise failure

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore2.NetworkStream:
        raise OutboundRefused("url", "Unix sockets are not outbound targets")


class _Decoder:
    """The response body as httpx hands it on: decoded by :class:`outbound.Inflater` (identity
    passes through, counted), within the policy's cap and the total deadline."""

    def __init__(self, encoding: str, limit: int, deadline: float | None) -> None:
        self.limit = limit
        self.total = 0
        self.deadline = deadline
        try:
            self.inflater = None if encoding in ("", "identity") else Inflater(encoding, limit)
        except ValueError as exc:
            raise httpx2.DecodingError(str(exc)) from None

    def feed(self, chunk: bytes) -> bytes:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise httpx2.ReadTimeout("the response did not arrive within the total timeout")
        if self.inflater is not None:
            try:
                return self.inflater.feed(chunk)
            except zlib.error:
                raise httpx2.DecodingError("the compressed body is corrupt") from None
        self.total += len(chunk)
        if self.total > self.limit:
            raise ResponseTooLarge(self.limit)
        return chunk


class _CappedAsyncStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, decoder: _Decoder) -> None:
        self.inner = inner
        self.decoder = decoder

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            data = self.decoder.feed(chunk)
            if data:
                yield data

    async def aclose(self) -> None:
        await self.inner.aclose()


class _CappedStream(httpx2.SyncByteStream):
    def __init__(self, inner: httpx2.SyncByteStream, decoder: _Decoder) -> None:
        self.inner = inner
        self.decoder = decoder

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            data = self.decoder.feed(chunk)
            if data:
                yield data

    def close(self) -> None:
        self.inner.close()


def _prepare(request: httpx2.Request, policy: OutboundPolicy) -> None:
    outbound.check_scheme(request.url.scheme.lower(), policy)
    request.headers["Accept-Encoding"] = _ENCODINGS


def _capped_headers(response: httpx2.Response) -> tuple[str, list[tuple[bytes, bytes]]]:
    encoding = response.headers.get("content-encoding", "").strip().lower()
    dropped = (b"content-encoding", b"content-length") if encoding else ()
    return encoding, [(k, v) for k, v in response.headers.raw if k.lower() not in dropped]


def _pool_options(limits: httpx2.Limits) -> dict[str, Any]:
    return {
        "max_connections": limits.max_connections,
        "max_keepalive_connections": limits.max_keepalive_connections,
        "keepalive_expiry": limits.keepalive_expiry,
    }


class GuardedAsyncTransport(httpx2.AsyncHTTPTransport):
    """httpx2's transport over a :class:`GuardedAsyncBackend` pool, with the size cap and an
    optional total timeout (``None``: httpx's per-operation timeouts only)."""

    def __init__(
        self,
        policy: OutboundPolicy,
        *,
        verify: ssl.SSLContext,
        limits: httpx2.Limits | None = None,
        total_timeout: float | None = None,
    ) -> None:
        limits = limits or httpx2.Limits()
        super().__init__(verify=verify, limits=limits, trust_env=False)
        self.policy = policy
        self.total_timeout = total_timeout
        # The same pool httpx2 makes, with the guarded backend (httpx2 has no parameter for it).
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=verify, network_backend=GuardedAsyncBackend(policy), **_pool_options(limits)
        )

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        _prepare(request, self.policy)
        deadline = None if self.total_timeout is None else time.monotonic() + self.total_timeout
        async with asyncio.timeout(self.total_timeout):
            response = await super().handle_async_request(request)
        encoding, headers = _capped_headers(response)
        try:
            decoder = _Decoder(encoding, self.policy.max_body_bytes, deadline)
        except httpx2.DecodingError:
            await response.aclose()
            raise
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        return httpx2.Response(
            response.status_code, headers=headers, extensions=response.extensions,
            stream=_CappedAsyncStream(response.stream, decoder),
        )  # fmt: skip


class GuardedTransport(httpx2.HTTPTransport):
    """:class:`GuardedAsyncTransport` for synchronous clients."""

    def __init__(
        self,
        policy: OutboundPolicy,
        *,
        verify: ssl.SSLContext | None = None,
        limits: httpx2.Limits | None = None,
        total_timeout: float | None = None,
    ) -> None:
        limits = limits or httpx2.Limits()
        context = verify or httpx2.create_ssl_context()
        super().__init__(verify=context, limits=limits, trust_env=False)
        self.policy = policy
        self.total_timeout = total_timeout
        self._pool = httpcore2.ConnectionPool(
            ssl_context=context, network_backend=GuardedBackend(policy), **_pool_options(limits)
        )

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        _prepare(request, self.policy)
        deadline = None if self.total_timeout is None else time.monotonic() + self.total_timeout
        response = super().handle_request(request)
        encoding, headers = _capped_headers(response)
        try:
            decoder = _Decoder(encoding, self.policy.max_body_bytes, deadline)
        except httpx2.DecodingError:
            response.close()
            raise
        assert isinstance(response.stream, httpx2.SyncByteStream)
        return httpx2.Response(
            response.status_code, headers=headers, extensions=response.extensions,
            stream=_CappedStream(response.stream, decoder),
        )  # fmt: skip


def async_client(
    policy: OutboundPolicy,
    *,
    verify: ssl.SSLContext,
    limits: httpx2.Limits | None = None,
    total_timeout: float | None = None,
    follow_redirects: bool = False,
) -> httpx2.AsyncClient:
    """An ``httpx2.AsyncClient`` whose every connection goes through the guard (redirects off
    by default; when on, each hop's connection is checked like the first)."""
    transport = GuardedAsyncTransport(
        policy, verify=verify, limits=limits, total_timeout=total_timeout
    )
    return httpx2.AsyncClient(
        transport=transport, follow_redirects=follow_redirects, trust_env=False
    )


def client(
    policy: OutboundPolicy,
    *,
    timeout: float,
    connect_timeout: float | None = None,
    follow_redirects: bool = False,
) -> httpx2.Client:
    """A synchronous guarded client: connect within ``connect_timeout`` (default the policy's),
    the whole answer within ``timeout``."""
    connect = min(timeout, connect_timeout or policy.connect_timeout)
    return httpx2.Client(
        transport=GuardedTransport(policy, total_timeout=timeout),
        timeout=httpx2.Timeout(timeout, connect=connect),
        follow_redirects=follow_redirects,
        trust_env=False,
    )


def post_json(url: str, payload: Any, *, policy: OutboundPolicy, timeout: float = 10.0) -> int:
    """POST ``payload`` as JSON through the guard; the status code of a 2xx answer. Raises
    :class:`OutboundRefused` (nothing was sent), ``httpx2.HTTPError`` (including any non-2xx,
    redirects too: they are not followed) or :class:`ResponseTooLarge`."""
    outbound.check_url(url, policy)
    with client(policy, timeout=timeout) as http:
        response = http.post(url, json=payload)
        response.raise_for_status()
        return response.status_code


_shared_lock = threading.Lock()
_shared: tuple[OutboundPolicy, httpx2.Client] | None = None


def shared_client(timeout: float = 30.0) -> tuple[OutboundPolicy, httpx2.Client]:
    """The process-wide outbound policy now and one synchronous client (per policy) whose every
    connection it checks, shared by threads: building a client costs more than a loopback
    request (its TLS context)."""
    global _shared
    policy = outbound.current_policy()
    with _shared_lock:
        if _shared is None or _shared[0] is not policy:
            if _shared is not None:
                _shared[1].close()
            _shared = (policy, client(policy, timeout=timeout))
        return _shared

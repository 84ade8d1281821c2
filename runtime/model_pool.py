"""Pooled HTTP clients for a long-lived event loop (the run driver's): a model call made on a
pooling loop borrows a client and its keep-alive connection instead of making new ones."""

from __future__ import annotations

import asyncio
import functools
import ssl
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx2

from runtime import http_lite, outbound_http
from runtime.outbound import OutboundPolicy


@functools.cache
def ssl_context() -> ssl.SSLContext:
    return httpx2.create_ssl_context()


class _ClientPool:
    """Idle HTTP clients of one event loop, each with at most one keep-alive connection.

    A call borrows a client (the most recently returned, whose connection is the likeliest to
    be alive) and gives it back; no client ever holds more than one connection (see
    docs/performance.md for why not one shared client)."""

    def __init__(self) -> None:
        self.idle: dict[OutboundPolicy, list[httpx2.AsyncClient]] = {}
        self.closed = False
        #: The plain JSON calls' keep-alive connections (``http_lite``).
        self.lite = http_lite.Pool(ssl_context())

    @staticmethod
    def _new(policy: OutboundPolicy) -> httpx2.AsyncClient:
        limits = httpx2.Limits(max_connections=1, max_keepalive_connections=1)
        return outbound_http.async_client(policy, verify=ssl_context(), limits=limits)

    @asynccontextmanager
    async def borrow(self, policy: OutboundPolicy) -> AsyncIterator[httpx2.AsyncClient]:
        """An idle client whose connection ``policy`` checked, or a new one."""
        idle = self.idle.get(policy)
        client = idle.pop() if idle else self._new(policy)
        try:
            yield client
        finally:
            idle = self.idle.setdefault(policy, [])
            if self.closed or len(idle) >= POOL_IDLE_CLIENTS:
                await client.aclose()
            else:
                idle.append(client)

    async def close(self) -> None:
        self.closed = True
        idle, self.idle = self.idle, {}
        for clients in idle.values():
            for client in clients:
                await client.aclose()
        if self.lite is not None:
            await self.lite.close()


#: Event loops that pool their model connections (the run driver's).
_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _ClientPool] = (
    weakref.WeakKeyDictionary()
)
#: Idle clients (keep-alive connections) kept per loop.
POOL_IDLE_CLIENTS = 256


def pool_http_connections(loop: asyncio.AbstractEventLoop) -> None:
    """Let model calls made on ``loop`` reuse HTTP clients and their keep-alive connections
    (:class:`_ClientPool`) instead of making a client and a connection per call.

    For a long-lived loop that closes the pool itself (:func:`close_http_pool`): the run
    driver's."""
    _POOLS.setdefault(loop, _ClientPool())


def loop_pool() -> _ClientPool | None:
    try:
        return _POOLS.get(asyncio.get_running_loop())
    except RuntimeError:
        return None


def lite_pool() -> http_lite.Pool | None:
    pool = loop_pool()
    return None if pool is None else pool.lite


async def close_http_pool() -> None:
    """Close the running loop's idle pooled clients and stop pooling on this loop."""
    pool = _POOLS.pop(asyncio.get_running_loop(), None)
    if pool is not None:
        await pool.close()

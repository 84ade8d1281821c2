"""A plain TCP forwarder: the "network" between simulated hosts and the machine's services.

``python -m tests.support.tcp_proxy LISTEN_HOST:PORT=UPSTREAM_HOST:PORT ...`` listens on each
address (in the root network namespace, on the host side of a veth pair) and copies bytes both
ways to the upstream (PostgreSQL and Redis on loopback); it prints ``PROXY_READY`` once every
listener accepts. It never closes or times out a connection on its own: when a simulated host
is partitioned, its connections hang as they would across a real network, and resume on heal.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


def _forwarder(upstream: tuple[str, int]) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*upstream)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        for each in (writer, up_writer):
            each.close()
            with contextlib.suppress(Exception):
                await each.wait_closed()

    return handle


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def main(specs: list[str]) -> None:
    servers = []
    for spec in specs:
        listen, _, upstream = spec.partition("=")
        host, port = _address(listen)
        handler = _forwarder(_address(upstream))
        servers.append(await asyncio.start_server(handler, host, port, reuse_address=True))
    print("PROXY_READY", flush=True)
    await asyncio.gather(*(server.serve_forever() for server in servers))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(sys.argv[1:]))

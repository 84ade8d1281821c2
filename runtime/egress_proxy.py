"""The allowlisting HTTP(S) proxy behind ``isolation.networkAccess: restricted``.

A sandboxed program with ``restricted`` network has no network of its own; its HTTP clients
reach this proxy through the in-sandbox forwarder (``sandbox.egress``) and a Unix socket the
proxy listens on. Per connection the proxy reads one request head and serves:

- ``CONNECT host:port`` (HTTPS and any TLS): a tunnel to the host;
- ``GET http://host[:port]/path`` and the other methods with an absolute ``http`` URI: the request
  forwarded in origin form with ``Connection: close`` (one request per connection).

The host must match ``isolation.allowedHosts`` (``api.example.com``, ``*.example.com``, ``*`` for
any) and then pass the outbound guard (``runtime.outbound``): never metadata or link-local
addresses, never the server's own database or Redis, loopback and private ranges per
``LOOPWRIGHT_OUTBOUND_PRIVATE``. The proxy connects to the address it checked (no DNS rebinding).
A refusal is a ``403`` whose body names the rule; each decision is kept in :attr:`EgressProxy.log`
so the caller can report what was refused.

Pure asyncio, no Django: the proxy runs in the event loop of the caller (the ``bash`` tool, the
skill worker) for the duration of one sandboxed run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from runtime.outbound import (
    OutboundPolicy,
    OutboundRefused,
    canonical_host,
    current_policy,
    host_listed,
    resolve_checked_async,
)
from sandbox import (
    OutputMeter,
    SandboxConfig,
    SandboxRequest,
    SandboxResult,
    run_sandboxed_async,
)

_MAX_HEAD_BYTES = 16 * 1024
_HEAD_TIMEOUT_SECONDS = 10.0
_CHUNK = 64 * 1024
#: Dropped from a forwarded request; ``Host`` is rewritten from the absolute URI (RFC 9112 3.2.2).
_HOP_HEADERS = frozenset(
    {"proxy-connection", "proxy-authorization", "connection", "keep-alive", "host"}
)


@dataclass(frozen=True)
class EgressDecision:
    host: str
    port: int
    allowed: bool
    reason: str = ""


def host_allowed(host: str, allowed_hosts: Iterable[str]) -> bool:
    """``isolation.allowedHosts`` matching: exact names, ``*.domain`` (subdomains only), ``*``."""
    hosts = [h.strip().lower().rstrip(".") for h in allowed_hosts]
    return "*" in hosts or host_listed(host.lower().rstrip("."), hosts)


@dataclass
class EgressProxy:
    """One proxy instance: ``async with EgressProxy(hosts) as proxy`` gives ``proxy.socket``."""

    allowed_hosts: tuple[str, ...]
    #: The outbound guard's rules; None: the process-wide policy (``current_policy()``).
    policy: OutboundPolicy | None = None
    #: Where the socket's directory is made; it must be searchable by the sandbox uid.
    parent_dir: str | None = None
    setting: str = "isolation.allowedHosts"
    #: Where the setting came from, as refusals show it (`` (set by profile:x@1)``).
    layer: str = ""
    log: list[EgressDecision] = field(default_factory=list)
    socket: str = ""
    _server: asyncio.AbstractServer | None = None
    _dir: str = ""
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def __aenter__(self) -> EgressProxy:
        self._dir = tempfile.mkdtemp(prefix="lw-egress-", dir=self.parent_dir)
        # The sandbox uid (another uid under a root runner) must pass the directory and
        # connect to the socket; listing stays closed.
        os.chmod(self._dir, 0o711)  # noqa: S103
        self.socket = os.path.join(self._dir, "proxy.sock")
        self._server = await asyncio.start_unix_server(self._serve, path=self.socket)
        os.chmod(self.socket, 0o666)  # noqa: S103
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        shutil.rmtree(self._dir, ignore_errors=True)

    def refusals(self) -> list[EgressDecision]:
        return [d for d in self.log if not d.allowed]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self._handle(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with asyncio.timeout(_HEAD_TIMEOUT_SECONDS):
            head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > _MAX_HEAD_BYTES:
            return await _reply(writer, 431, "request head too large")
        lines = head.decode("latin-1").split("\r\n")
        try:
            method, target, version = lines[0].split(" ")
        except ValueError:
            return await _reply(writer, 400, "malformed request line")
        parsed = _target(method, target)
        if parsed is None:
            return await _reply(
                writer, 400, "only CONNECT host:port and absolute http:// URLs are proxied"
            )
        host, port, path = parsed
        refusal = await self._check(host, port)
        if isinstance(refusal, str):
            return await _reply(writer, 403, refusal)
        upstream_reader, upstream_writer = refusal
        try:
            if method.upper() == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                authority = host if port == 80 else f"{host}:{port}"
                if ":" in host:
                    authority = f"[{host}]" if port == 80 else f"[{host}]:{port}"
                head = _origin_head(method, path, version, authority, lines[1:])
                upstream_writer.write(head)
            await writer.drain()
            await _splice(reader, writer, upstream_reader, upstream_writer)
        finally:
            upstream_writer.close()

    async def _check(
        self, host: str, port: int
    ) -> str | tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            name = canonical_host(host)
        except OutboundRefused as exc:
            return self._refuse(host, port, str(exc))
        if not host_allowed(name, self.allowed_hosts):
            listed = ", ".join(self.allowed_hosts)
            return self._refuse(
                name, port, f"{name} is not in {self.setting} [{listed}]{self.layer}"
            )
        policy = self.policy or current_policy()
        try:
            addresses = await resolve_checked_async(
                name, port, policy, timeout=policy.connect_timeout
            )
        except OutboundRefused as exc:
            return self._refuse(name, port, str(exc))
        except (OSError, TimeoutError) as exc:
            return self._refuse(name, port, f"{name} could not be resolved: {exc}")
        error: Exception | None = None
        for address in addresses:
            try:
                async with asyncio.timeout(policy.connect_timeout):
                    opened = await asyncio.open_connection(address.split("%")[0], port)
            except (OSError, TimeoutError) as exc:
                error = exc
                continue
            self.log.append(EgressDecision(name, port, True))
            return opened
        return self._refuse(name, port, f"{name}:{port} could not be reached: {error}")

    def _refuse(self, host: str, port: int, reason: str) -> str:
        self.log.append(EgressDecision(host, port, False, reason))
        return reason


def _target(method: str, target: str) -> tuple[str, int, str] | None:
    """``(host, port, origin-form path)`` of a request line, or None when not proxied."""
    if method.upper() == "CONNECT":
        host, _, digits = target.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not host or not digits.isdigit() or not 0 < int(digits) < 65536:
            return None
        return host, int(digits), ""
    try:
        parts = urlsplit(target)
        port = parts.port or 80
    except ValueError:
        return None
    if parts.scheme.lower() != "http" or not parts.hostname or parts.username is not None:
        return None
    path = parts.path or "/"
    if parts.query:
        path += f"?{parts.query}"
    return parts.hostname, port, path


def _origin_head(method: str, path: str, version: str, authority: str, headers: list[str]) -> bytes:
    kept = [
        line
        for line in headers
        if line and line.split(":", 1)[0].strip().lower() not in _HOP_HEADERS
    ]
    lines = [f"{method} {path} {version}", f"Host: {authority}", *kept, "Connection: close"]
    return "\r\n".join([*lines, "", ""]).encode("latin-1")


async def _reply(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    text = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large"}
    body = f"refused by the egress proxy: {reason}\n".encode()
    writer.write(
        f"HTTP/1.1 {status} {text[status]}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    with contextlib.suppress(OSError):
        await writer.drain()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    finally:
        if writer.can_write_eof():
            with contextlib.suppress(OSError):
                writer.write_eof()


async def _splice(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    upstream_reader: asyncio.StreamReader,
    upstream_writer: asyncio.StreamWriter,
) -> None:
    await asyncio.gather(
        _pipe(reader, upstream_writer), _pipe(upstream_reader, writer), return_exceptions=True
    )


@contextlib.asynccontextmanager
async def egress_for(
    request: SandboxRequest,
    allowed_hosts: Iterable[str],
    config: SandboxConfig | None = None,
    policy: OutboundPolicy | None = None,
    layer: str = "",
) -> AsyncIterator[tuple[SandboxRequest, EgressProxy | None]]:
    """``request`` with a proxy socket when its network is ``restricted`` (else unchanged);
    ``layer`` (`` (set by profile:x@1)``) is appended to host refusals."""
    if request.network != "restricted":
        yield request, None
        return
    parent = (config or SandboxConfig.from_env()).resolved_work_root()
    proxy = EgressProxy(tuple(allowed_hosts), policy=policy, parent_dir=parent, layer=layer)
    async with proxy:
        yield replace(request, egress_socket=proxy.socket, egress_hosts=proxy.allowed_hosts), proxy


def egress_notes(proxy: EgressProxy | None) -> list[str]:
    """One line per distinct host the proxy refused."""
    if proxy is None:
        return []
    seen: dict[tuple[str, int], str] = {}
    for decision in proxy.refusals():
        seen.setdefault((decision.host, decision.port), decision.reason)
    return [f"network: {host}:{port} refused: {why}" for (host, port), why in seen.items()]


async def run_restricted_async(
    request: SandboxRequest,
    allowed_hosts: Iterable[str],
    config: SandboxConfig | None = None,
    policy: OutboundPolicy | None = None,
    meter: OutputMeter | None = None,
) -> SandboxResult:
    """Run ``request``; with ``restricted`` network behind a proxy allowing ``allowed_hosts``.
    Refused hosts are added to the result's notes."""
    async with egress_for(request, allowed_hosts, config, policy) as (proxied, proxy):
        result = await run_sandboxed_async(proxied, config, meter)
    notes = egress_notes(proxy)
    if not notes:
        return result
    return replace(result, notes=(*result.notes, *notes))


def run_restricted(
    request: SandboxRequest,
    allowed_hosts: Iterable[str],
    config: SandboxConfig | None = None,
    policy: OutboundPolicy | None = None,
    meter: OutputMeter | None = None,
) -> SandboxResult:
    """The synchronous form (Celery skill workers): its own event loop for the run."""
    return asyncio.run(run_restricted_async(request, allowed_hosts, config, policy, meter))

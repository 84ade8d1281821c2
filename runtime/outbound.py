"""The outbound guard: which addresses the server may connect to on a user's behalf.

Every request the server makes for an operator or an agent (model endpoints, the approval
webhook, Git import, later the MCP and A2A clients) goes through these rules, on every new
connection and again for every redirect hop (each hop is a new connection):

- only the policy's schemes (``http``, ``https``); no userinfo (``user@host``) in URLs;
- host names are checked, then resolved, and every resolved address is checked; the caller
  connects to the checked address itself (``Host`` and TLS SNI keep the name), so a DNS answer
  that changes between the check and the connect (rebinding) is never used;
- never: link-local and cloud metadata addresses (and metadata host names), unspecified,
  multicast, broadcast and reserved ranges, and the host:port pairs of the server's own
  database and Redis/broker;
- loopback and private ranges by one setting, ``LOOPWRIGHT_OUTBOUND_PRIVATE=allow|deny``;
- IPv4-mapped, IPv4-compatible, NAT64, 6to4 and Teredo IPv6 forms are checked as the IPv4
  address they carry; numeric host forms other than dotted decimal (``2130706433``,
  ``0177.0.0.1``, ``0x7f000001``, ``127.1``) are refused as non-canonical.

This module is pure (no Django, no I/O except the resolver it is given): the rules, the
policy value and :class:`OutboundRefused`, whose message names the rule that refused.
``runtime.outbound_http`` applies them to httpx and ``http_lite`` connections.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import ipaddress
import os
import re
import socket
import threading
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal
from urllib.parse import SplitResult, urlsplit

PrivateMode = Literal["allow", "deny"]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
#: ``(host, port) -> addresses``; the default asks the system resolver (getaddrinfo).
Resolver = Callable[[str, int], Sequence[str]]

PRIVATE_SETTING = "LOOPWRIGHT_OUTBOUND_PRIVATE"
DEFAULT_SCHEMES = frozenset({"http", "https"})
#: Largest response body a guarded request reads (decoded bytes): 16 MiB.
MAX_BODY_BYTES = 16 * 1024 * 1024
CONNECT_TIMEOUT_SECONDS = 10.0

#: Cloud instance metadata services (AWS, GCP, Azure, OCI, DigitalOcean, ECS task metadata,
#: Alibaba, AWS IPv6, Oracle Cloud classic): refused whatever the mode.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254", "192.0.0.192")
)
METADATA_NAMES = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "metadata.azure.internal",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.tencentyun.com",
        "metadata.platformequinix.com",
    }
)

_NEVER: tuple[tuple[str, ipaddress.IPv4Network | ipaddress.IPv6Network], ...] = tuple(
    (label, ipaddress.ip_network(net))
    for label, net in (
        ("an unspecified", "0.0.0.0/32"),
        ("a 'this network' (reserved)", "0.0.0.0/8"),
        ("a link-local", "169.254.0.0/16"),
        ("a multicast", "224.0.0.0/4"),
        ("a broadcast", "255.255.255.255/32"),
        ("a reserved", "240.0.0.0/4"),
        ("a reserved (IETF protocol assignments)", "192.0.0.0/24"),
        ("a reserved (documentation)", "192.0.2.0/24"),
        ("a reserved (documentation)", "198.51.100.0/24"),
        ("a reserved (documentation)", "203.0.113.0/24"),
        ("a reserved (benchmarking)", "198.18.0.0/15"),
        ("an unspecified", "::/128"),
        ("a link-local", "fe80::/10"),
        ("a multicast", "ff00::/8"),
        ("a reserved (discard)", "100::/64"),
        ("a reserved (documentation)", "2001:db8::/32"),
        ("a reserved", "::/8"),
    )
)
_PRIVATE: tuple[tuple[str, ipaddress.IPv4Network | ipaddress.IPv6Network], ...] = tuple(
    (label, ipaddress.ip_network(net))
    for label, net in (
        ("a loopback", "127.0.0.0/8"),
        ("a private", "10.0.0.0/8"),
        ("a private", "172.16.0.0/12"),
        ("a private", "192.168.0.0/16"),
        ("a shared (carrier-grade NAT)", "100.64.0.0/10"),
        ("a loopback", "::1/128"),
        ("a unique local", "fc00::/7"),
        ("a site-local", "fec0::/10"),
    )
)
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # RFC 2765 "IPv4-translated"
_NUMERIC_HOST = re.compile(r"^(?:(?:0x[0-9a-f]*|[0-9]+)\.){0,3}(?:0x[0-9a-f]*|[0-9]+)$")
_NAME = re.compile(r"^[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?$")
_DEFAULT_PORTS = {"http": 80, "https": 443}
_SEVERITY = ("metadata", "never", "service", "private", "host")


class OutboundRefused(Exception):
    """The guard refused a URL or an address; the message names the rule (``rule`` is a
    short code: ``scheme``, ``url``, ``host``, ``metadata``, ``never``, ``service``,
    ``private``)."""

    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(f"{reason} (outbound guard)")
        self.rule = rule
        self.reason = reason


class ResponseTooLarge(Exception):
    """A guarded response's body (decoded) passed the policy's size cap."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the response is larger than {_size(limit)} (outbound guard)")
        self.limit = limit


def _size(limit: int) -> str:
    return f"{limit // 2**20} MiB" if limit % 2**20 == 0 else f"{limit} bytes"


@dataclass(frozen=True)
class Service:
    """One of the server's own backing services (database, Redis, broker): never a target."""

    label: str
    host: str
    port: int
    addresses: frozenset[IPAddress] = frozenset()


def system_resolver(host: str, port: int) -> list[str]:
    """The addresses ``getaddrinfo`` gives for ``host`` (TCP), in its order, without repeats."""
    seen: list[str] = []
    for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        address = str(sockaddr[0])
        if address not in seen:
            seen.append(address)
    return seen


@dataclass(frozen=True, eq=False)
class OutboundPolicy:
    """The rules one kind of request is checked against. Compared and hashed by identity:
    connection pools key their kept-alive connections by the policy that checked them."""

    private: PrivateMode = "allow"
    schemes: frozenset[str] = DEFAULT_SCHEMES
    services: tuple[Service, ...] = ()
    resolver: Resolver = field(default=system_resolver)
    connect_timeout: float = CONNECT_TIMEOUT_SECONDS
    max_body_bytes: int = MAX_BODY_BYTES

    def with_schemes(self, schemes: Iterable[str]) -> OutboundPolicy:
        return replace(self, schemes=frozenset(s.lower() for s in schemes))


@dataclass(frozen=True)
class Target:
    """A URL that passed the static checks: ``host`` is ASCII, lower case, without brackets."""

    scheme: str
    host: str
    port: int
    url: str

    @property
    def literal(self) -> IPAddress | None:
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None


# --- settings ----------------------------------------------------------------------------------


def parse_private_mode(value: str | None) -> PrivateMode:
    """``LOOPWRIGHT_OUTBOUND_PRIVATE``: ``allow`` (default) or ``deny``; anything else raises
    ValueError with a message for the operator."""
    mode = (value or "allow").strip().lower()
    if mode == "allow":
        return "allow"
    if mode == "deny":
        return "deny"
    raise ValueError(
        f"{PRIVATE_SETTING} must be 'allow' or 'deny' (loopback and private addresses for "
        f"outbound requests); got {value!r}"
    )


def service(label: str, url: str, *, resolver: Resolver = system_resolver) -> Service | None:
    """The backing service a connection URL names (``postgres://``, ``redis://``, ...), with
    the addresses its host resolves to now; None for URLs without a TCP host (SQLite, files)."""
    default_ports = {"postgres": 5432, "postgresql": 5432, "pgsql": 5432, "redis": 6379}
    default_ports |= {"rediss": 6379, "amqp": 5672, "amqps": 5671, "mysql": 3306}
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower().split("+")[0]
    if scheme not in default_ports:
        return None
    host = (parts.hostname or "localhost").rstrip(".").lower()
    return service_at(label, host, port or default_ports[scheme], resolver=resolver)


def service_at(
    label: str, host: str, port: int, *, resolver: Resolver = system_resolver
) -> Service:
    try:
        found = {_normalised(ipaddress.ip_address(a.split("%")[0])) for a in resolver(host, port)}
    except (OSError, ValueError, UnicodeError):
        found = set()  # resolved later by name comparison only
    return Service(label, host, port, frozenset(found))


def policy_from_environ(environ: Mapping[str, str] | None = None) -> OutboundPolicy:
    """The policy the environment configures (for processes without Django settings)."""
    env = os.environ if environ is None else environ
    services = [
        found
        for label in ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL")
        if env.get(label) and (found := service(label, env[label])) is not None
    ]
    return OutboundPolicy(
        private=parse_private_mode(env.get(PRIVATE_SETTING)), services=tuple(services)
    )


def parse_schemes(
    value: str | None, *, setting: str, default: str, permitted: Iterable[str]
) -> frozenset[str]:
    """A comma-separated scheme list from a setting; ValueError naming the setting for a scheme
    outside ``permitted`` (the ones the guard can pin to a checked address)."""
    chosen = [s.strip().lower() for s in (value if value is not None else default).split(",")]
    chosen = [s for s in chosen if s]
    bad = sorted(set(chosen) - set(permitted))
    if bad or not chosen:
        raise ValueError(
            f"{setting} may list only {', '.join(sorted(permitted))} (the schemes whose "
            f"connections the outbound guard checks); got {value!r}"
        )
    return frozenset(chosen)


def parse_hosts(value: str | None, *, setting: str) -> frozenset[str]:
    """A comma-separated host list (``example.com`` or ``*.example.com``); empty: any host."""
    hosts = frozenset(h.strip().lower().rstrip(".") for h in (value or "").split(",") if h.strip())
    for host in hosts:
        name = host.removeprefix("*.")
        if not _NAME.match(name) or "*" in name:
            raise ValueError(f"{setting} lists {host!r}, which is not a host name or *.domain")
    return hosts


def host_listed(host: str, hosts: Iterable[str]) -> bool:
    """Whether ``host`` is one of ``hosts`` or under one of their ``*.domain`` entries."""
    for entry in hosts:
        if host == entry or (entry.startswith("*.") and host.endswith(entry[1:])):
            return True
    return False


_configured: OutboundPolicy | Callable[[], OutboundPolicy] | None = None
_lock = threading.Lock()


def configure(policy: OutboundPolicy | Callable[[], OutboundPolicy] | None) -> None:
    """Set the process-wide policy, or a function that builds it on first use (Django's
    settings do that); None: from the environment on next use."""
    global _configured
    _configured = policy


def current_policy() -> OutboundPolicy:
    """The process-wide policy of model calls and webhooks (built once, then shared)."""
    global _configured
    found = _configured
    if isinstance(found, OutboundPolicy):
        return found
    with _lock:
        if _configured is None:
            _configured = policy_from_environ()
        elif not isinstance(_configured, OutboundPolicy):
            _configured = _configured()
        return _configured


# --- addresses ---------------------------------------------------------------------------------


def _normalised(ip: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 form carries (mapped, compatible, translated, NAT64), else ip."""
    if isinstance(ip, ipaddress.IPv4Address):
        return ip
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    value = int(ip)
    if ip in _TRANSLATED or any(ip in net for net in _NAT64):
        return ipaddress.IPv4Address(value & 0xFFFFFFFF)
    if value >> 32 == 0 and value > 1:  # ::a.b.c.d (deprecated IPv4-compatible)
        return ipaddress.IPv4Address(value)
    return ip


def _embedded(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """IPv4 addresses a 6to4 or Teredo address carries (reached through relays: still checked)."""
    found = []
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.append(ip.teredo[1])
    return found


def address_category(address: IPAddress) -> tuple[str, bool]:
    """(what the address is, whether it is refused whatever the mode). Private ones come back
    as (label, False); public as ("public", False)."""
    ip = _normalised(address)
    if ip in METADATA_ADDRESSES or address in METADATA_ADDRESSES:
        return "a cloud metadata address", True
    if ip.is_loopback:
        return "a loopback address", False
    for label, net in _NEVER:
        if ip.version == net.version and ip in net:
            return f"{label} address", True
    if isinstance(ip, ipaddress.IPv6Address):
        for inner in _embedded(ip):
            label, never = address_category(inner)
            if never or label != "public":
                return f"{label} (carried in {ip})", never
    for label, net in _PRIVATE:
        if ip.version == net.version and ip in net:
            return f"{label} address", False
    return "public", False


def _is_loopback(ip: IPAddress) -> bool:
    return _normalised(ip).is_loopback


def check_address(address: str, port: int, policy: OutboundPolicy, *, host: str = "") -> str:
    """``address`` (a literal, as resolved) if ``policy`` allows connecting to it on ``port``;
    else raise :class:`OutboundRefused` naming the rule."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        raise OutboundRefused("host", f"{address!r} is not an IP address") from None
    shown = f"{host} ({address})" if host and host != address else address
    category, never = address_category(ip)
    if never:
        rule = "metadata" if "metadata" in category else "never"
        raise OutboundRefused(rule, f"{shown} is {category}: never allowed")
    _check_services(ip, port, policy, shown)
    if category != "public" and policy.private == "deny":
        raise OutboundRefused(
            "private", f"{shown} is {category}; {PRIVATE_SETTING}=deny refuses loopback and "
            "private addresses"
        )  # fmt: skip
    return address


def _check_services(ip: IPAddress, port: int, policy: OutboundPolicy, shown: str) -> None:
    normal = _normalised(ip)
    for found in policy.services:
        if port != found.port:
            continue
        local = any(_is_loopback(a) for a in found.addresses) or found.host == "localhost"
        if normal in found.addresses or (local and _is_loopback(normal)):
            raise OutboundRefused(
                "service", f"{shown} port {port} is the server's own service ({found.label}): "
                "never allowed"
            )  # fmt: skip


# --- host names and URLs -------------------------------------------------------------------------


def canonical_host(host: str) -> str:
    """``host`` as the checks and the resolver see it (ASCII, lower case, no trailing dot, no
    brackets), or :class:`OutboundRefused` for names and numeric forms that are refused as such."""
    raw = host.strip("[]")
    if "%" in raw:
        raise OutboundRefused("host", f"{host!r}: scoped or percent-encoded hosts are refused")
    try:
        ascii_host = (raw if raw.isascii() else raw.encode("idna").decode("ascii")).lower()
    except UnicodeError:
        raise OutboundRefused("host", f"{host!r} is not a valid host name") from None
    name = ascii_host[:-1] if ascii_host.endswith(".") and ":" not in ascii_host else ascii_host
    if not name:
        raise OutboundRefused("host", "the URL has no host")
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    if _NUMERIC_HOST.match(name):
        meaning = _inet_aton(name)
        said = f" (it would mean {meaning})" if meaning else ""
        raise OutboundRefused(
            "host", f"{host!r} is a non-canonical numeric host{said}; write an IPv4 address in "
            "dotted-decimal form"
        )  # fmt: skip
    if not _NAME.match(name) or ".." in name:
        raise OutboundRefused("host", f"{host!r} is not a valid host name")
    if name in METADATA_NAMES:
        raise OutboundRefused("metadata", f"{name} is a cloud metadata host name: never allowed")
    return name


def _inet_aton(name: str) -> str:
    try:
        return socket.inet_ntoa(socket.inet_aton(name))
    except OSError:
        return ""


def check_scheme(scheme: str, policy: OutboundPolicy) -> None:
    """Refuse a scheme (lower case) the policy does not list."""
    if scheme not in policy.schemes:
        allowed = ", ".join(sorted(policy.schemes)) or "none"
        raise OutboundRefused(
            "scheme", f"scheme {scheme or '(none)'!r} is not allowed (allowed: {allowed})"
        )


class Inflater:
    """Undoes a ``Content-Encoding`` (``gzip``, ``deflate`` with or without its zlib wrapper)
    chunk by chunk, never producing more than ``limit`` bytes in all (a compressed bomb stops
    there with :class:`ResponseTooLarge`); a corrupt body raises ``zlib.error``."""

    def __init__(self, encoding: str, limit: int) -> None:
        if encoding not in ("gzip", "x-gzip", "deflate"):
            raise ValueError(f"unsupported Content-Encoding {encoding!r}")
        self.limit = limit
        self.total = 0
        self._raw_fallback = encoding == "deflate"
        self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding != "deflate" else 15)

    def feed(self, chunk: bytes) -> bytes:
        room = self.limit - self.total + 1
        try:
            data: bytes = self._zlib.decompress(chunk, room)
        except zlib.error:
            if self.total or not self._raw_fallback:
                raise
            self._raw_fallback = False  # "deflate" sent without the zlib wrapper
            self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
            data = self._zlib.decompress(chunk, room)
        self.total += len(data)
        if self.total > self.limit or self._zlib.unconsumed_tail:
            raise ResponseTooLarge(self.limit)
        return data


def check_url(url: str, policy: OutboundPolicy) -> Target:
    """The static checks of ``url`` (scheme, userinfo, host form, metadata names, literal
    addresses): a :class:`Target` to resolve, or :class:`OutboundRefused`."""
    if any(ch.isspace() or ord(ch) < 0x20 or ch == "\\" for ch in url):
        raise OutboundRefused("url", "the URL contains spaces, control characters or '\\'")
    try:
        parts: SplitResult = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise OutboundRefused("url", f"not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    check_scheme(scheme, policy)
    if "@" in parts.netloc:
        raise OutboundRefused("url", "credentials in the URL (user@host) are not accepted")
    if not parts.hostname:
        raise OutboundRefused("url", "the URL has no host")
    port = port if port is not None else _DEFAULT_PORTS.get(scheme, 0)
    if not 0 < port < 65536:
        raise OutboundRefused("url", f"port {port} is not a usable port")
    host = canonical_host(parts.hostname)
    target = Target(scheme, host, port, url)
    literal = target.literal
    if literal is not None:
        check_address(str(literal), port, policy)
    else:
        _check_service_names(host, port, policy)
    return target


@functools.lru_cache(maxsize=1024)
def check_url_cached(url: str, policy: OutboundPolicy) -> Target:
    """:func:`check_url`, remembered per (URL, policy): for clients that call the same URL
    many times (the model client checks its endpoint's URL on every call, at no cost)."""
    return check_url(url, policy)


def _check_service_names(host: str, port: int, policy: OutboundPolicy) -> None:
    for found in policy.services:
        if found.port == port and found.host == host:
            raise OutboundRefused(
                "service",
                f"{host}:{port} is the server's own service ({found.label}): never allowed",
            )


def resolve_checked(host: str, port: int, policy: OutboundPolicy) -> list[str]:
    """The addresses to connect to for ``host``: all resolved addresses, each checked (one
    forbidden address refuses the name). Resolver errors (``OSError``) pass through."""
    name = canonical_host(host)
    try:
        ipaddress.ip_address(name)
    except ValueError:
        _check_service_names(name, port, policy)
        addresses = list(policy.resolver(name, port))
    else:
        addresses = [name]
    if not addresses:
        raise OSError(f"{name} did not resolve to any address")
    refusals = []
    for address in addresses:
        try:
            check_address(address, port, policy, host=name)
        except OutboundRefused as exc:
            refusals.append(exc)
    if refusals:  # the gravest reason: a metadata address outweighs a private one
        raise min(refusals, key=lambda exc: _SEVERITY.index(exc.rule))
    return addresses


async def resolve_checked_async(
    host: str, port: int, policy: OutboundPolicy, *, timeout: float | None = None
) -> list[str]:
    """:func:`resolve_checked` from async code: a literal costs nothing; a name is resolved in
    a thread (as asyncio's own connect would), within ``timeout``."""
    name = canonical_host(host)
    try:
        ipaddress.ip_address(name)
    except ValueError:
        pass
    else:
        return [check_address(name, port, policy)]
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout):
        return await loop.run_in_executor(None, resolve_checked, name, port, policy)


def check_url_now(url: str, policy: OutboundPolicy, *, timeout: float = 5.0) -> Target:
    """Save-time check: :func:`check_url`, then the name's current addresses. A name that does
    not resolve now (or not within ``timeout``) passes: every connect checks it again."""
    target = check_url(url, policy)
    if target.literal is None:
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        try:
            pool.submit(resolve_checked, target.host, target.port, policy).result(timeout)
        except (OSError, concurrent.futures.TimeoutError):
            pass
        finally:
            pool.shutdown(wait=False)
    return target

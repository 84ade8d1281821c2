"""Simulated worker hosts: Linux network namespaces joined to this machine by veth pairs.

Each :class:`SimulatedHost` is a namespace with its own loopback and one veth end
(``10.<net>.<n>.2``); the other end (``10.<net>.<n>.1``) stays in the root namespace, where a
:class:`ServiceProxy` forwards that address's PostgreSQL and Redis ports to the machine's
servers on loopback. A process started with :meth:`SimulatedHost.argv` reaches the database
and the broker only across its veth pair, so :meth:`~SimulatedHost.partition` (the link taken
down: packets dropped, connections hang, nothing is reset) cuts it off exactly as a network
would, and :meth:`~SimulatedHost.heal` lets the held packets through again.

Needs root and iproute2 (``ip netns``); :func:`netns_unavailable` says why not otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tests.support.chaos import ManagedProcess
from tests.support.workers import WorkerProcess

SERVICE_PORTS = (5432, 6379)  # PostgreSQL, Redis: what a worker host reaches


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    probe = f"lwprobe{os.getpid() % 100000}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


class SimulatedHost:
    """One "machine": a network namespace reaching the services through its veth pair."""

    def __init__(self, tag: str, index: int, net: int) -> None:
        self.name = f"{tag}h{index}"  # the namespace; interface names stay under 15 chars
        self.outside = f"{tag}h{index}a"  # the veth end in the root namespace
        self.inside = f"{tag}h{index}b"
        self.gateway = f"10.{net}.{index}.1"  # where this host finds PostgreSQL and Redis
        self.address = f"10.{net}.{index}.2"
        self.created = False

    def create(self) -> SimulatedHost:
        _ip("netns", "add", self.name)
        self.created = True
        _ip("link", "add", self.outside, "type", "veth", "peer", "name", self.inside)
        _ip("link", "set", self.inside, "netns", self.name)
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.outside)
        _ip("link", "set", self.outside, "up")
        inside = ("netns", "exec", self.name, "ip")
        _ip(*inside, "link", "set", "lo", "up")
        _ip(*inside, "addr", "add", f"{self.address}/24", "dev", self.inside)
        _ip(*inside, "link", "set", self.inside, "up")
        _ip(*inside, "route", "add", "default", "via", self.gateway)
        return self

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host (``ip netns exec`` execs it: the pid is the same)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def database_url(self, dbname: str) -> str:
        return f"postgres://postgres@{self.gateway}:5432/{dbname}"

    def redis_url(self, db: int) -> str:
        return f"redis://{self.gateway}:6379/{db}"

    def partition(self) -> None:
        """Take the link down: this host's packets are dropped until :meth:`heal`."""
        _ip("link", "set", self.outside, "down")

    def heal(self) -> None:
        _ip("link", "set", self.outside, "up")
        _ip("route", "replace", f"{self.gateway.rsplit('.', 1)[0]}.0/24", "dev", self.outside)
        # Address lookups that failed while cut off are cached for a while; forget them, as a
        # healed switch port would be relearned at once.
        _ip("neigh", "flush", "dev", self.outside, check=False)
        _ip("netns", "exec", self.name, "ip", "neigh", "flush", "dev", self.inside, check=False)

    def destroy(self) -> None:
        if self.created:
            _ip("netns", "del", self.name, check=False)  # takes the veth pair with it
            self.created = False

    def kill(self) -> None:
        """Teardown hook of the ``procs`` fixture."""
        self.destroy()


class ServiceProxy(ManagedProcess):
    """``tests.support.tcp_proxy`` forwarding each host's gateway ports to loopback."""

    def __init__(self, hosts: Sequence[SimulatedHost], log_dir: Path) -> None:
        specs = [f"{h.gateway}:{port}=127.0.0.1:{port}" for h in hosts for port in SERVICE_PORTS]
        argv = [sys.executable, "-m", "tests.support.tcp_proxy", *specs]
        super().__init__("tcp-proxy", argv, log_dir / "tcp-proxy.log", dict(os.environ))

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "PROXY_READY" in self.log():
                return
            if not self.alive():
                break
            time.sleep(0.05)
        raise RuntimeError(f"the TCP proxy did not start: {self.log()[-2000:]}")


def network_tag() -> tuple[str, int]:
    """A name prefix and a 10.x network of their own for this test process's hosts."""
    pid = os.getpid()
    return f"lwf{pid % 10000}", 100 + pid % 150


class HostWorker(WorkerProcess):
    """A ``celery worker`` on a simulated host: its database and broker URLs name the host's
    gateway, so every byte it exchanges with them crosses the host's veth pair."""

    def __init__(
        self, host: SimulatedHost, name: str, log_dir: Path, env: dict[str, str] | None = None
    ) -> None:
        super().__init__(name, log_dir, env)
        self.host = host

    def command(self) -> list[str]:
        return self.host.argv(super().command())

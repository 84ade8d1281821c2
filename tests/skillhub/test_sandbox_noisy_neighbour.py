"""docs/reliability.md S2 at the sandbox level: bombs in sandboxes next to a latency-sensitive server.

While fork bombs (one of them trying setsid() per child) and memory bombs (Python and
Node.js) run in sandboxes, this process serves
tiny HTTP requests on loopback at 20 req/s from a client thread. The server must keep its p99
under 500 ms, every bomb must end by its own limit, the kernel's OOM killer must not fire and
an unrelated host process must survive. (The full S2 with the Loopwright API comes later.)
"""

from __future__ import annotations

import asyncio
import http.client
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sandbox import SandboxRequest, SandboxResult, run_sandboxed_async

ATTACK_SECONDS = 6.0
REQUESTS_PER_SECOND = 20

PY_FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
#: A fork bomb whose children each try to start a session of their own: where the kernel
#: groups CPU time per session (sched_autogroup), that would multiply the bomb's CPU share.
PY_SESSION_BOMB = """
import os
while True:
    try:
        if os.fork() == 0:
            try:
                os.setsid()
            except OSError:
                pass
            while True:
                pass
    except OSError:
        pass
"""
NODE_FORK_BOMB = """
const cp = require("child_process");
setInterval(() => {
  for (let i = 0; i < 20; i++) {
    try { cp.spawn("/bin/sh", ["-c", "while :; do :; done"], { stdio: "ignore" })
            .on("error", () => {}); } catch (e) {}
  }
}, 20);
"""
#: Several processes, each under RLIMIT_AS, together far over the sandbox's memory_bytes.
PY_MEMORY_BOMB = """
import os, time
for _ in range(8):
    if os.fork() == 0:
        hoard = []
        while True:
            try:
                hoard.append(b"x" * (32 * 1024 * 1024))
            except MemoryError:
                time.sleep(1)
time.sleep(60)
"""
NODE_MEMORY_BOMB = """
const hoard = [];
for (;;) hoard.push(Buffer.alloc(32 * 1024 * 1024, 1));
"""


class TinyHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"sum": sum(range(1000))}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass
class Probe:
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@pytest.fixture
def server() -> Iterator[int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), TinyHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


def measure(port: int, stop: threading.Event, probe: Probe) -> None:
    interval = 1 / REQUESTS_PER_SECOND
    next_at = time.monotonic()
    while not stop.is_set():
        started = time.monotonic()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/")
            conn.getresponse().read()
            conn.close()
            probe.latencies.append(time.monotonic() - started)
        except OSError as exc:
            probe.errors.append(repr(exc))
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))


async def attack() -> dict[str, list[SandboxResult]]:
    deadline = time.monotonic() + ATTACK_SECONDS

    async def repeat(request: SandboxRequest) -> list[SandboxResult]:
        # Memory bombs end quickly; run them again and again for the whole window.
        results = [await run_sandboxed_async(request)]
        while time.monotonic() < deadline:
            results.append(await run_sandboxed_async(request))
        return results

    async def once(request: SandboxRequest) -> list[SandboxResult]:
        return [await run_sandboxed_async(request)]

    names = ["py-fork", "py-session", "node-fork", "py-memory", "node-memory"]
    runs = await asyncio.gather(
        once(SandboxRequest(language="python", code=PY_FORK_BOMB, timeout_seconds=ATTACK_SECONDS)),
        once(
            SandboxRequest(language="python", code=PY_SESSION_BOMB, timeout_seconds=ATTACK_SECONDS)
        ),
        once(SandboxRequest(language="node", code=NODE_FORK_BOMB, timeout_seconds=ATTACK_SECONDS)),
        repeat(SandboxRequest(language="python", code=PY_MEMORY_BOMB, timeout_seconds=20)),
        repeat(SandboxRequest(language="node", code=NODE_MEMORY_BOMB, timeout_seconds=20)),
    )
    return dict(zip(names, runs, strict=True))


def oom_kills() -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(len(ordered) * 0.99) - 1)]


def test_bombs_in_sandboxes_do_not_hurt_a_neighbouring_server(server: int) -> None:
    bystander = subprocess.Popen(["sleep", "300"])
    oom_before = oom_kills()
    probe, stop = Probe(), threading.Event()
    client = threading.Thread(target=measure, args=(server, stop, probe), daemon=True)
    client.start()
    try:
        results = asyncio.run(attack())
    finally:
        stop.set()
        client.join(timeout=10)
    try:
        assert bystander.poll() is None, "a host process outside the sandboxes died"
    finally:
        bystander.kill()
        bystander.wait()

    assert oom_kills() == oom_before, "the kernel OOM killer fired"
    assert probe.errors == []
    assert len(probe.latencies) >= ATTACK_SECONDS * REQUESTS_PER_SECOND * 0.8
    assert p99(probe.latencies) <= 0.5, f"p99 {p99(probe.latencies):.3f} s"

    for name in ("py-fork", "py-session", "node-fork"):
        (result,) = results[name]
        assert result.killed_reason == "timeout", (name, result.stderr[-300:])
    for name in ("py-memory", "node-memory"):
        for result in results[name]:
            assert result.killed_reason == "memory", (name, result.stderr[-300:])
    for runs in results.values():
        assert all(r.leftover_processes == 0 and r.duration_ms < 20_000 for r in runs)
    print(  # the figures S2 asks for, shown with -s
        f"\nS2: {len(probe.latencies)} requests, p99 {p99(probe.latencies) * 1000:.0f} ms, "
        f"max {max(probe.latencies) * 1000:.0f} ms; memory bomb runs: "
        f"{len(results['py-memory'])} python, {len(results['node-memory'])} node"
    )

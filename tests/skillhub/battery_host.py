"""The host side of the S1 sandbox battery: what it plants (canary files, a secret, a loopback
listener), the case and outcome records, and how it finds processes that outlived a run."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sandbox import Language, MiB, SandboxConfig, SandboxLimits, SandboxResult

REPO = Path(__file__).resolve().parents[2]
OUTPUT_CAP = 1 * MiB
#: Parallel sandboxes while the battery runs (2 cores: the bombs are CPU-bound).
CONCURRENCY = 10

TITLES = {
    1: "read-host-file",
    2: "write-outside-workdir",
    3: "loopback-redis-postgres",
    4: "env-secret",
    5: "proc-and-other-sandboxes",
    6: "fork-bomb",
    7: "memory-bomb",
    8: "cpu-loop",
    9: "sleep-forever",
    10: "50mib-stdout",
    11: "grandchild-outlives-timeout",
    12: "ptrace-mount",
    13: "host-shell-command",
    14: "symlink-to-host",
}


@dataclass
class Host:
    """What the host side plants before the battery and inspects after it."""

    canary_dir: Path
    canary_file: Path
    canary_text: str
    secret: str
    drop_dir: Path
    listener_port: int
    listener_hits: list[str] = field(default_factory=list)

    def lit(self, value: object) -> str:
        """A literal valid in both Python and JavaScript (JSON of an ASCII str or int)."""
        return json.dumps(value if isinstance(value, int) else str(value))


@dataclass(frozen=True)
class Case:
    number: int
    language: Language
    code: str
    check: Callable[[SandboxResult, Host], list[str]]
    timeout: float = 10.0
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    collect_outputs: str | None = None
    marker: str | None = None
    #: Told apart in keys: "" (the runner's own flags) or "-open" (Deno's wall opened by a
    #: test-only interpreter wrapper, battery_deno.py); ``config`` runs it (None: from_env).
    variant: str = ""
    config: SandboxConfig | None = None

    @property
    def key(self) -> str:
        return f"{self.language}{self.variant}-{self.number:02d}"


@dataclass(frozen=True)
class Outcome:
    result: SandboxResult
    wall_seconds: float
    marker_processes: list[int]


# --- host-side helpers -----------------------------------------------------------------------


def processes_with(needle: str) -> list[int]:
    """Host pids whose argv contains ``needle`` (zombies excluded: they run nothing)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle.encode() in cmdline and state not in ("Z", "X"):
            found.append(int(name))
    return found


def uid_processes(low: int, high: int) -> list[tuple[int, int]]:
    """(pid, uid) of every live process with a uid in [low, high)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = Path(f"/proc/{name}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        uids = {int(u) for u in fields.get("Uid", "").split()}
        if fields.get("State", "").strip()[:1] not in ("Z", "X"):
            found += [(int(name), u) for u in sorted(uids) if low <= u < high][:1]
    return found


def leaked_sandbox_processes(config: SandboxConfig, grace_seconds: float = 3.0) -> list[int]:
    """Processes of the battery's sandbox uids still alive once a grace for exiting ends.

    ``planted_host`` gives the battery a uid range and slot directory of its own, so every
    process in that range is the battery's: the other xdist worker's sandboxes (and whatever a
    worker killed mid-run by a chaos test leaves in a default slot) are never counted.
    """
    deadline = time.monotonic() + grace_seconds
    while True:
        leaked = [pid for pid, _ in uid_processes(config.uid_base, config.sandbox_uids().stop)]
        if not leaked or time.monotonic() >= deadline:
            return leaked
        time.sleep(0.1)


#: Private uid ranges for batteries start here, clear of the default range (1.5e9 + 65).
BATTERY_UID_BASE = 1_600_000_000


@contextlib.contextmanager
def planted_host() -> Iterator[Host]:
    # World-readable and world-writable on purpose: only the mount namespace keeps the
    # sandbox away from them (the rlimit-only backend would reach both).
    canary_dir = Path(f"/tmp/lw-canary-{uuid.uuid4().hex}")
    canary_dir.mkdir(mode=0o755)
    os.chmod(canary_dir, 0o755)  # noqa: S103 (readable by anyone but the sandbox)
    canary_text = f"CANARY-{uuid.uuid4().hex}"
    canary_file = canary_dir / "secret.txt"
    canary_file.write_text(canary_text)
    os.chmod(canary_file, 0o644)
    drop_dir = canary_dir / "drop"
    drop_dir.mkdir()
    os.chmod(drop_dir, 0o777)  # noqa: S103 (writable by anyone but the sandbox)
    listener = socket.create_server(("127.0.0.1", 0))
    hits: list[str] = []
    stop = threading.Event()
    thread = threading.Thread(target=_accept_loop, args=(listener, hits, stop), daemon=True)
    thread.start()
    slot_dir = tempfile.mkdtemp(prefix="lw-battery-slots-")  # 0700, ours
    with pytest.MonkeyPatch.context() as patch:
        secret = f"SECRET-{uuid.uuid4().hex}"
        patch.setenv("LW_CANARY_API_KEY", secret)
        # A uid range of this process's own (see leaked_sandbox_processes).
        uid_base = BATTERY_UID_BASE + (os.getpid() % 10_000) * 100
        patch.setenv("LOOPWRIGHT_SANDBOX_UID_BASE", str(uid_base))
        patch.setenv("LOOPWRIGHT_SANDBOX_UID_SLOTS", "16")
        patch.setenv("LOOPWRIGHT_SANDBOX_SLOT_DIR", slot_dir)
        yield Host(
            canary_dir=canary_dir,
            canary_file=canary_file,
            canary_text=canary_text,
            secret=secret,
            drop_dir=drop_dir,
            listener_port=listener.getsockname()[1],
            listener_hits=hits,
        )
    stop.set()
    listener.close()
    thread.join(timeout=2)
    shutil.rmtree(canary_dir)
    shutil.rmtree(slot_dir, ignore_errors=True)


def _accept_loop(listener: socket.socket, hits: list[str], stop: threading.Event) -> None:
    listener.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, peer = listener.accept()
        except (TimeoutError, OSError):
            continue
        hits.append(str(peer))
        conn.close()

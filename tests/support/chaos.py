"""Failure injection for the durability tests (docs/reliability.md, D1-D9).

Everything here starts real processes in their own session (process group) and knows how to
kill the whole group, so a test never leaves an orphan: ``celery beat`` for the reaper, a
private ``redis-server`` (D7) and a private PostgreSQL cluster (D8). The machine's shared Redis
and PostgreSQL are never restarted.

It also holds the audit helpers the tests share: which runs a worker held when it was killed,
how often each run was claimed, and the side-effect ledger per idempotency key.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django.db import connection

from loops.models import LoopEvent, LoopRun
from tests.support.workers import ROOT, WorkerProcess, worker_env

HOSTNAME = socket.gethostname()


# --- processes ---------------------------------------------------------------------------------


class ManagedProcess:
    """A subprocess in its own session, logging to a file; ``kill`` takes the whole group."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str]) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal_group(self, sig: int) -> None:
        if self.alive():
            os.killpg(self.pid, sig)

    def kill(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            assert self.proc is not None
            self.proc.wait(timeout=10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def beat_process(log_dir: Path, reaper_interval: float = 1.0, **env: str) -> ManagedProcess:
    """``celery beat`` publishing ``loops.reap`` every ``reaper_interval`` seconds."""
    schedule = log_dir / f"beat-schedule-{uuid.uuid4().hex[:6]}"
    full_env = {
        **os.environ,
        **worker_env(),
        "LOOPWRIGHT_REAPER_INTERVAL_SECONDS": str(reaper_interval),
        **env,
    }
    argv = [
        sys.executable, "-m", "celery", "-A", "orchestrator", "beat", "-l", "INFO",
        "-s", str(schedule), "--pidfile=",
    ]  # fmt: skip
    return ManagedProcess("beat", argv, log_dir / "beat.log", full_env).start()


def owner_prefix(worker: WorkerProcess) -> str:
    """Every lease a worker process takes has an owner starting with this (see driver)."""
    assert worker.proc is not None
    return f"{HOSTNAME}:{worker.proc.pid}:"


def leased_by(prefix: str) -> set[uuid.UUID]:
    """Runs whose lease is currently held by an owner with this prefix."""
    return set(LoopRun.objects.filter(lease_owner__startswith=prefix).values_list("id", flat=True))


def log_tails(procs: Sequence[Any], chars: int = 3000) -> str:
    parts = []
    for proc in procs:
        text = proc.log() if hasattr(proc, "log") else ""
        parts.append(f"----- {getattr(proc, 'name', proc)} (last {chars} chars) -----\n")
        parts.append(text[-chars:])
    return "\n".join(parts)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def missing_binaries(*names: str) -> list[str]:
    return [name for name in names if shutil.which(name) is None and not _pg_bin_or_none(name)]


# --- audits on the test database ---------------------------------------------------------------


def claims_per_run() -> Counter[uuid.UUID]:
    """How many times each run was claimed (one ``lease.claimed`` event per claim)."""
    rows = LoopEvent.objects.filter(type="lease.claimed").values_list("run_id", flat=True)
    return Counter(rows)


def attempts_per_key() -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT idempotency_key, count(*) FROM lw_test_side_effect_attempts "
            "GROUP BY idempotency_key"
        )
        return {str(key): int(n) for key, n in cursor.fetchall()}


def effect_rows() -> list[tuple[str, str, int]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT idempotency_key, run_id, pid FROM lw_test_side_effects")
        return [(str(k), str(r), int(p)) for k, r, p in cursor.fetchall()]


def first_claim_after(run_id: uuid.UUID, moment: float) -> float | None:
    """Wall-clock time of the first claim of ``run_id`` after ``moment`` (``time.time()``)."""
    for event in LoopEvent.objects.filter(run_id=run_id, type="lease.claimed").order_by("seq"):
        stamp = event.created_at.timestamp()
        if stamp > moment:
            return stamp
    return None


def purge_broker() -> None:
    """Drop nudges left in the broker queue by an earlier test (they would be harmless)."""
    from orchestrator.celery import app

    with contextlib.suppress(Exception):
        app.control.purge()


# --- a private redis-server (D7) ---------------------------------------------------------------


class RedisServer:
    """A throw-away ``redis-server`` on its own port; never the machine's shared one."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = root
        self.port = port or free_port()
        self.proc: ManagedProcess | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10) -> None:
        self.starts += 1
        argv = [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--daemonize", "no", "--dir", str(self.root),
        ]  # fmt: skip
        log = self.root / "redis.log"
        self.proc = ManagedProcess("redis", argv, log, dict(os.environ)).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ping():
                return
            time.sleep(0.05)
        raise TimeoutError(f"redis-server on {self.port} did not start: {self.proc.log()[-2000:]}")

    def ping(self) -> bool:
        result = subprocess.run(
            ["redis-cli", "-p", str(self.port), "ping"], capture_output=True, timeout=5
        )
        return result.stdout.strip() == b"PONG"

    def shutdown_nosave(self) -> None:
        """``redis-cli shutdown nosave``: every queued message is lost."""
        subprocess.run(["redis-cli", "-p", str(self.port), "shutdown", "nosave"], timeout=10)
        if self.proc is not None and self.proc.proc is not None:
            self.proc.proc.wait(timeout=10)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()

    def log(self) -> str:
        return self.proc.log() if self.proc else ""

    name = "redis-server"


# --- a private PostgreSQL cluster (D8) --------------------------------------------------------


def _pg_bin_or_none(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    return candidates[0] if candidates else None


def pg_bin(name: str) -> str:
    found = _pg_bin_or_none(name)
    if found is None:
        raise FileNotFoundError(name)
    return found


def postgres_cluster_unavailable() -> str | None:
    """Why a private cluster cannot be created here, or None when it can."""
    missing = [n for n in ("initdb", "pg_ctl") if _pg_bin_or_none(n) is None]
    if missing:
        return f"PostgreSQL server binaries not installed ({', '.join(missing)})"
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to own a private cluster"
    return None


class PostgresCluster:
    """A throw-away cluster in a temp dir on a free port (trust auth, loopback only)."""

    name = "postgres-cluster"

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.root = Path(tempfile.mkdtemp(prefix="lw-pg-"))
        self.data = self.root / "data"
        self.log_path = self.root / "postgres.log"

    def _as_owner(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv

    def _run(self, argv: list[str], timeout: float = 120) -> None:
        result = subprocess.run(
            self._as_owner(argv), capture_output=True, timeout=timeout, cwd=self.root
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{argv[0]} failed ({result.returncode}): {result.stdout!r} {result.stderr!r}\n"
                f"{self.log()[-2000:]}"
            )

    def init(self) -> PostgresCluster:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(
            [pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
             "-E", "UTF8", "--no-sync"]
        )  # fmt: skip
        return self

    def _pg_ctl(self, *args: str) -> None:
        # -l again on restart: without it the new postmaster would inherit our pipes.
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c full_page_writes=off -c max_connections=100"
        )
        self._run(
            [pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log_path), "-o", options,
             "-w", "-t", "60", *args]
        )  # fmt: skip

    def start(self) -> None:
        self._pg_ctl("start")

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every connection is terminated, the server comes back."""
        self._pg_ctl("-m", "fast", "restart")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(Exception):
                self._run([pg_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"])

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def kill(self) -> None:
        """Teardown hook of the ``procs`` fixture: the cluster is dropped with its files."""
        self.destroy()

    def url(self, dbname: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def connect(self, dbname: str = "postgres") -> Any:
        import psycopg

        return psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=5)

    def create_database(self, dbname: str) -> None:
        with self.connect() as conn:
            conn.execute(f'CREATE DATABASE "{dbname}"')

    def query(self, dbname: str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.connect(dbname) as conn:
            return list(conn.execute(sql, params).fetchall())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def django_subprocess(code: str, env: dict[str, str], timeout: float = 180) -> Any:
    """Run ``code`` in a fresh Django process with ``env``; it may print one JSON line last."""
    script = "import django, json\ndjango.setup()\n" + code
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        timeout=timeout,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"subprocess failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    return json.loads(lines[-1]) if lines else None


def manage_migrate(env: dict[str, str], timeout: float = 300) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        timeout=timeout,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"migrate failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


# --- clock skew (faketime) ---------------------------------------------------------------------


def libfaketime() -> str | None:
    """Path of the multi-threaded libfaketime (Debian package ``faketime``), if installed."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    return found[0] if found else None


def faketime_env(offset: str) -> dict[str, str]:
    """Environment that shifts a process's wall clock by ``offset`` (e.g. ``+120s``).

    The monotonic clock is left alone: asyncio and kombu time-outs use it, and a skewed host
    has a skewed wall clock, not a broken monotonic one.
    """
    lib = libfaketime()
    assert lib is not None
    return {"LD_PRELOAD": lib, "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def run_history(run_id: uuid.UUID | str) -> str:
    """A run's events and steps, one line each, for failure messages."""
    lines = [f"run {run_id}:"]
    for e in LoopEvent.objects.filter(run_id=run_id).order_by("seq"):
        lines.append(
            f"  ev {e.seq:3} {e.created_at:%H:%M:%S.%f} {e.type:22} {e.from_status:>9}->"
            f"{e.to_status:<9} {e.actor} {e.data}"
        )
    from loops.models import LoopStep

    for s in LoopStep.objects.filter(run_id=run_id).order_by("seq"):
        lines.append(
            f"  st {s.seq:3} {s.started_at:%H:%M:%S.%f} {s.invocation:8} {s.status:9} "
            f"token={s.lease_token} {s.request}"
        )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, idempotency_key, pid FROM lw_test_side_effect_attempts WHERE run_id = %s "
            "ORDER BY id",
            [str(run_id)],
        )
        lines += [f"  attempt #{i} {k} pid={p}" for i, k, p in cursor.fetchall()]
    return "\n".join(lines)

"""Real worker processes for end-to-end tests: ``celery worker`` subprocesses on the test DB."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def test_database_url() -> str:
    """A DATABASE_URL pointing at the database this test process uses (the test database)."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    user = s.get("USER") or "postgres"
    host = s.get("HOST") or "127.0.0.1"
    port = s.get("PORT") or 5432
    return f"postgres://{user}@{host}:{port}/{s['NAME']}"


class WorkerProcess:
    """One ``celery worker`` (threads pool) running the run driver."""

    def __init__(self, name: str, log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_dir / f"worker-{name}.log"
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        env = {**os.environ, **worker_env(), **self.env}
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the fd
            self.proc = self._spawn(env, log)
        return self

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", "orchestrator", "worker", "-Q", "loops",
            "--pool", "threads", "-c", "2", "--without-gossip", "--without-mingle",
            "--without-heartbeat", "-l", "INFO", "-n", f"{self.name}@%h",
        ]  # fmt: skip

    def _spawn(self, env: dict[str, str], log: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.command(), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def is_ready(self) -> bool:
        return self.alive() and b"ready." in self.log_path.read_bytes()

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if b"ready." in self.log_path.read_bytes():
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited: {self.log()[-2000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"worker {self.name} not ready: {self.log()[-2000:]}")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def signal_group(self, sig: int) -> None:
        """Signal every process of the worker's session (SIGSTOP/SIGCONT freeze it whole)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, sig)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group: no chance to release anything."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        elif self.proc is not None:
            # The leader is gone; make sure nothing of its group is left behind either.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def stop(self, timeout: float = 60) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def worker_env(**overrides: Any) -> dict[str, str]:
    env = {
        "DATABASE_URL": test_database_url(),
        "LOOPWRIGHT_INVOKER": "tests.support.invokers.SideEffectInvoker",
        "LOOPWRIGHT_LEASE_SECONDS": "3",
        "LOOPWRIGHT_HEARTBEAT_SECONDS": "1",
        "LOOPWRIGHT_POLL_INTERVAL_SECONDS": "0.3",
        "LOOPWRIGHT_DRAIN_SECONDS": "5",
        "PYTHONUNBUFFERED": "1",
    }
    env.update({k: str(v) for k, v in overrides.items()})
    return env


def wait_for(predicate: Any, timeout: float, interval: float = 0.2, message: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(message or "condition not met in time")

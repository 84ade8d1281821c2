"""``manage.py up``: web + worker + scheduler in the foreground (the embedded default).

Each role is a separate process, as in production (deploy/ runs them as separate services);
this command only starts them together, prefixes their output and stops them together.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser


def _pump(name: str, stream: IO[bytes], out: Any) -> None:
    for raw in iter(stream.readline, b""):
        out.write(f"{name:>9} | {raw.decode(errors='replace')}")
        out.flush()


def _open_at(host: str, port: int) -> str:
    """Where to open the UI: ``LOOPWRIGHT_PUBLIC_URL`` when set, else the bound address (this
    machine for a wildcard host)."""
    if os.environ.get("LOOPWRIGHT_PUBLIC_URL"):
        return f"{settings.PUBLIC_URL}/"
    shown = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host  # noqa: S104
    return f"http://{shown}:{port}/"


class Command(BaseCommand):
    help = "Start the web server, a worker and the scheduler together in the foreground."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=os.environ.get("LOOPWRIGHT_HOST", "127.0.0.1"))
        parser.add_argument(
            "--port", type=int, default=int(os.environ.get("LOOPWRIGHT_PORT", "8000"))
        )

    def _commands(self, host: str, port: int) -> dict[str, list[str]]:
        py = sys.executable
        beat_schedule = str(settings.VAR_DIR / "celerybeat-schedule")
        return {
            "web": [py, "-m", "uvicorn", "orchestrator.asgi:application", "--host", host,
                    "--port", str(port), "--no-access-log"],
            "worker": [py, "-m", "celery", "-A", "orchestrator", "worker", "-Q", "loops,skills",
                       "--pool", "threads", "-c", "4", "--without-gossip", "--without-mingle",
                       "--without-heartbeat", "-l", "INFO"],
            "scheduler": [py, "-m", "celery", "-A", "orchestrator", "beat", "-l", "INFO",
                          "--schedule", beat_schedule],
        }  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        procs: dict[str, subprocess.Popen[bytes]] = {}
        for name, cmd in self._commands(options["host"], options["port"]).items():
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            procs[name] = proc
            assert proc.stdout is not None
            threading.Thread(
                target=_pump, args=(name, proc.stdout, self.stdout), daemon=True
            ).start()
        url = _open_at(options["host"], options["port"])
        self.stdout.write(self.style.SUCCESS(f"Loopwright is starting at {url} (Ctrl-C stops it)"))
        stopping = False

        def stop(*_: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        while not stopping and all(p.poll() is None for p in procs.values()):
            time.sleep(0.3)
        self._shutdown(procs)

    def _shutdown(self, procs: dict[str, subprocess.Popen[bytes]]) -> None:
        for name, proc in procs.items():
            if proc.poll() is None:
                proc.terminate()
            else:
                self.stderr.write(f"{name} exited with code {proc.returncode}")
        deadline = time.monotonic() + 40
        for proc in procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()

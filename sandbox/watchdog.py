"""One thread that watches the resident memory of every running sandbox in this process.

RLIMIT_AS bounds each process, not a sandbox: 32 processes of 512 MiB each are 16 GiB. Where
no memory cgroup is available to the runner, this watchdog sums the anonymous resident memory
of each run's processes and kills the run when it passes ``limits.memory_bytes``. One ``/proc``
walk per tick serves every run, so the cost does not grow with the number of sandboxes.

It is a backstop, not a hard limit: between two ticks a run can overshoot by what it allocates
in one interval (bounded by max_processes x address space). The per-process RLIMIT_AS and the
OOM score of 1000 (see command.py) cover that window.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from sandbox.procs import RunScope, snapshot

INTERVAL_SECONDS = 0.2


@dataclass(frozen=True)
class _Watch:
    scope: RunScope
    limit_bytes: int
    on_exceeded: Callable[[], None]


class MemoryWatchdog:
    def __init__(self, interval: float = INTERVAL_SECONDS) -> None:
        self._interval = interval
        self._watches: dict[int, _Watch] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._next_id = 0

    def watch(self, scope: RunScope, limit_bytes: int, on_exceeded: Callable[[], None]) -> int:
        with self._lock:
            self._next_id += 1
            self._watches[self._next_id] = _Watch(scope, limit_bytes, on_exceeded)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="sandbox-memory-watchdog", daemon=True
                )
                self._thread.start()
            return self._next_id

    def unwatch(self, watch_id: int) -> None:
        with self._lock:
            self._watches.pop(watch_id, None)

    def _loop(self) -> None:
        while True:
            with self._lock:
                self._wake.wait(self._interval)
                if not self._watches:
                    self._thread = None
                    return  # idle: the next watch() starts a new thread
                watches = list(self._watches.items())
            self._check(watches)

    def _check(self, watches: list[tuple[int, _Watch]]) -> None:
        procs = snapshot()
        for watch_id, watch in watches:
            used = sum(p.rss_anon_bytes for p in watch.scope.members(procs))
            if used > watch.limit_bytes:
                self.unwatch(watch_id)
                watch.on_exceeded()


#: Shared by every run in this process.
WATCHDOG = MemoryWatchdog()

"""Killing one run: fast through the sandbox's PID 1, thorough through a ``/proc`` walk.

The fast path matters for the wall-clock promise (killed at most 1 s after the deadline): one
pidfd signal to bubblewrap's init makes the kernel kill the whole PID namespace. The walk is
the path when that init is not known yet, the rlimit-only backend's only path, and the
fallback when a kill did not end the run in time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from dataclasses import dataclass, field

from sandbox.launchfds import SandboxInit
from sandbox.procs import RunScope, hurry, kill_verified, snapshot
from sandbox.types import KilledReason


@dataclass
class RunKiller:
    """Kills the run's processes and remembers the first reason (thread-safe: the memory
    watchdog calls it from its own thread)."""

    scope: RunScope
    #: The rlimit-only backend spawns the program itself; bubblewrap's outer process is left
    #: alive so that it reaps the sandbox's init and exits with its status.
    include_root: bool
    reason: KilledReason | None = None
    #: The sandbox's PID 1 once bwrap has reported it (bubblewrap backend).
    init: SandboxInit | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def kill(self, reason: KilledReason) -> None:
        with self._lock:
            if self.reason is None:
                self.reason = reason
        self.kill_all()

    def kill_all(self) -> None:
        with self._lock:
            if self.init is not None and self._kill_init(self.init):
                return
        self.kill_walk()

    def kill_walk(self) -> None:
        """Kill every process found in ``/proc`` for the run: the path when bwrap's init is
        not known (yet), the rlimit-only backend, and the fallback when a kill did not end
        the run in time."""
        members = self.scope.members(snapshot())
        if not self.include_root:
            members = [p for p in members if p.pid != self.scope.root_pid]
            hurry(self.scope.root_pid)  # it has to wake up, reap and exit: same reason
        kill_verified(self.scope, members)

    def _kill_init(self, init: SandboxInit) -> bool:
        """Kill the sandbox's PID 1: the kernel then kills everything in its PID namespace,
        with no /proc walk on the critical path (a walk took 0.1-0.5 s on a loaded host)."""
        try:
            signal.pidfd_send_signal(init.pidfd, signal.SIGKILL)
        except OSError:
            return False  # already gone: let the walk look
        # Dying processes still need CPU to exit; at niceness 10 next to a fork bomb, PID 1's
        # reaping loop alone took about a second. setpriority() takes a pid, not the pidfd:
        # if PID 1 were reaped and its number reused in the microseconds between the two
        # calls (the pid counter would have to wrap), a stranger would get niceness 0.
        hurry(init.pid, uid=self.scope.uid)
        hurry(self.scope.root_pid)
        return True

    def adopt_init(self, task: asyncio.Task[SandboxInit | None]) -> None:
        if not task.cancelled() and task.exception() is None:
            with self._lock:
                self.init = task.result()

    def release(self) -> None:
        # Under the lock: the watchdog thread may be inside kill_all with this descriptor.
        with self._lock:
            if self.init is not None:
                os.close(self.init.pidfd)
                self.init = None

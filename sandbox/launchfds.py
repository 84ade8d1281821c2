"""The descriptors a bubblewrap run is started with, and their lifetimes.

* ``--seccomp FD``: the compiled filter (a memfd, read to its end by bwrap).
* ``--args FD``: bwrap's options, NUL-separated, kept off the command line (see command.py).
* ``--json-status-fd FD``: bwrap writes ``{"child-pid": N, ...}`` as soon as it has forked the
  sandbox's PID 1. Knowing that pid lets the runner kill the sandbox with one signal at the
  deadline instead of first walking ``/proc`` (which took 100+ ms on a loaded 2-core host).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

from sandbox import seccomp
from sandbox.command import Launch


@dataclass
class LaunchFds:
    seccomp: int | None
    args: int
    status_read: int
    status_write: int

    def passed(self) -> tuple[int, ...]:
        """The descriptors the child inherits (``pass_fds``)."""
        fds = (self.seccomp, self.args, self.status_write)
        return tuple(fd for fd in fds if fd is not None)

    def fill_args(self, launch: Launch) -> None:
        view = memoryview(launch.bwrap_options)
        while view:
            view = view[os.write(self.args, view) :]
        os.lseek(self.args, 0, os.SEEK_SET)

    def after_spawn(self) -> None:
        # Our copy of the write end would keep the status pipe open after bwrap exits.
        os.close(self.status_write)
        self.status_write = -1


@contextlib.contextmanager
def launch_fds(with_seccomp: bool) -> Iterator[LaunchFds]:
    """Fresh descriptors for one launch, all closed when the block exits."""
    status_read, status_write = os.pipe()  # close-on-exec; pass_fds makes one inheritable
    fds = LaunchFds(
        seccomp=seccomp.filter_fd() if with_seccomp else None,
        args=os.memfd_create("loopwright-bwrap-args", os.MFD_CLOEXEC),
        status_read=status_read,
        status_write=status_write,
    )
    try:
        yield fds
    finally:
        for fd in (fds.seccomp, fds.args, fds.status_read, fds.status_write):
            if fd is not None and fd >= 0:
                os.close(fd)


@dataclass(frozen=True)
class SandboxInit:
    pid: int
    pidfd: int


async def sandbox_init(status_fd: int, bwrap_pid: int) -> SandboxInit | None:
    """The sandbox's PID 1 (bwrap's init) with a pidfd, or None if bwrap never reported it.

    The pid is checked to still be a child of our bwrap after the pidfd is open, so the
    descriptor cannot refer to an unrelated process that reused the number.
    """
    line = await _first_line(status_fd)
    try:
        pid = int(json.loads(line)["child-pid"])
        pidfd = os.pidfd_open(pid)
    except (ValueError, KeyError, TypeError, OSError):
        return None
    if _parent_of(pid) != bwrap_pid:
        os.close(pidfd)
        return None
    return SandboxInit(pid=pid, pidfd=pidfd)


async def _first_line(fd: int) -> bytes:
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    done: asyncio.Future[bytes] = loop.create_future()
    buffer = bytearray()

    def on_readable() -> None:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return
        buffer.extend(chunk)
        if (not chunk or b"\n" in buffer) and not done.done():
            done.set_result(bytes(buffer).split(b"\n", 1)[0])

    loop.add_reader(fd, on_readable)
    try:
        return await done
    finally:
        loop.remove_reader(fd)


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("PPid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None

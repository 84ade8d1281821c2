"""Finding, measuring and killing the processes of one sandbox run, and the uid slots.

A run's processes are the union of three sets, each of which catches what the others miss:
the descendants of the process we spawned (bubblewrap's init re-parents every orphan inside the
PID namespace, so in that backend this set is complete), the members of its process group (the
rlimit-only backend), and, when the runner is root, every process of the run's dedicated host
uid (a daemon that double-forked and called ``setsid`` out of the tree is still caught).

Everything is read from ``/proc/<pid>/status``: it has the real/effective/saved uids (the
ownership of ``/proc/<pid>`` itself lies for non-dumpable processes), the parent, the process
group in the host namespace and the anonymous resident memory, in one read per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import random
import re
import signal
import stat
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

from sandbox.config import SandboxConfig
from sandbox.types import SandboxBusy, SandboxError


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    state: str
    uids: frozenset[int]
    rss_anon_bytes: int

    @property
    def alive(self) -> bool:
        # A zombie has released its memory and runs no code; its parent reaps it.
        return self.state not in ("Z", "X")


@dataclass(frozen=True)
class RunScope:
    """How to recognise the processes of one run."""

    root_pid: int
    pgid: int
    uid: int | None

    def members(self, procs: Iterable[Proc]) -> list[Proc]:
        """Live processes of the run (the spawned root itself included)."""
        table = {p.pid: p for p in procs if p.alive}
        found = {pid for pid, p in table.items() if self.owns(p)}
        found |= _descendants(table, self.root_pid)
        if self.root_pid in table:
            found.add(self.root_pid)
        return [table[pid] for pid in sorted(found)]

    def owns(self, proc: Proc) -> bool:
        return proc.pgid == self.pgid or (self.uid is not None and self.uid in proc.uids)


def _descendants(table: dict[int, Proc], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found: set[int] = set()
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, ()))
    return found


_STATUS_FIELDS = re.compile(
    rb"^(State|PPid|Uid|NSpgid|RssAnon):[ \t]*(\S+)(?:[ \t]+(\S+)[ \t]+(\S+)[ \t]+(\S+))?",
    re.MULTILINE,
)


def _parse_status(pid: int, data: bytes) -> Proc | None:
    fields = {match[1]: match for match in _STATUS_FIELDS.finditer(data)}
    try:
        uid = fields[b"Uid"]
        rss = fields.get(b"RssAnon")  # absent for kernel threads
        return Proc(
            pid=pid,
            ppid=int(fields[b"PPid"][2]),
            pgid=int(fields[b"NSpgid"][2]),
            state=fields[b"State"][2][:1].decode(),
            uids=frozenset(int(u) for u in uid.groups()[1:] if u is not None),
            rss_anon_bytes=int(rss[2]) * 1024 if rss is not None else 0,
        )
    except (KeyError, ValueError):
        return None  # a process that vanished mid-read


def read_proc(pid: int) -> Proc | None:
    # os.open/os.read: about a third cheaper than open().read() for ~100 small files, and a
    # snapshot runs on every kill, every sweep and every watchdog tick.
    try:
        fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _parse_status(pid, os.read(fd, 8192))
    except OSError:
        return None
    finally:
        os.close(fd)


def snapshot() -> list[Proc]:
    """Every process on the host (one ``/proc`` walk, ~3 ms for 100 processes)."""
    procs = []
    for name in os.listdir("/proc"):
        if name.isdigit() and (proc := read_proc(int(name))) is not None:
            procs.append(proc)
    return procs


def kill_verified(scope: RunScope, targets: Iterable[Proc]) -> None:
    """SIGKILL each target after re-checking, through a pidfd, that it still belongs to the run.

    Between the ``/proc`` walk and the signal a process can exit and its pid be reused by an
    unrelated process; as root that would kill a stranger. A pidfd pins the process, so the
    check made after opening it is about the process the signal will reach: it must still have
    the run's uid or process group, or a parent that is one of the run's processes.
    """
    targets = list(targets)
    family = {p.pid for p in targets} | {scope.root_pid}
    for target in targets:
        try:
            fd = os.pidfd_open(target.pid)
        except OSError:
            continue  # already gone
        try:
            proc = read_proc(target.pid)
            if proc is not None and proc.alive and (scope.owns(proc) or proc.ppid in family):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
                hurry(target.pid)
        except OSError:
            pass
        finally:
            os.close(fd)


def hurry(pid: int, *, uid: int | None = None) -> None:
    """Give a killed process (and with ``uid``, every process of that dedicated uid) normal CPU
    weight so it gets to run its exit.

    A SIGKILLed process still has to be scheduled to die; at niceness 10 next to a fork bomb's
    spinning processes that took hundreds of milliseconds. Lowering niceness needs root
    (CAP_SYS_NICE); otherwise the kill simply takes its course.
    """
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, 0)
    if uid is not None:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_USER, uid, 0)


async def sweep(scope: RunScope, *, grace_seconds: float = 1.0) -> int:
    """Kill what is left of a finished run and wait until nothing is; returns the survivors."""
    deadline = time.monotonic() + grace_seconds
    while (left := _kill_left(scope)) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return len(_survivors(scope)) if left else 0


def sweep_sync(scope: RunScope, *, grace_seconds: float = 1.0) -> int:
    """``sweep`` for callers without an event loop."""
    deadline = time.monotonic() + grace_seconds
    while (left := _kill_left(scope)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return len(_survivors(scope)) if left else 0


def _survivors(scope: RunScope) -> list[Proc]:
    return [p for p in scope.members(snapshot()) if p.pid != scope.root_pid]


def _kill_left(scope: RunScope) -> int:
    """Kill the run's live processes (the spawned root excepted); how many there were."""
    left = _survivors(scope)
    kill_verified(scope, left)
    return len(left)


# --- uid slots (root only) -------------------------------------------------------------------


@dataclass
class Slot:
    index: int
    uid: int
    #: Set by the runner when its final sweep found no survivor: the next holder of the slot
    #: can then skip its own sweep (one /proc walk less per run).
    clean: bool = False
    #: The previous holder did not finish cleanly (it crashed, or processes survived): its
    #: processes have been swept; its run directory may still be on disk.
    was_dirty: bool = False


_CLEAN = b"clean"
_BUSY = b"busy"


def _open_slot_dir(path: str) -> int:
    os.makedirs(path, mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    info = os.fstat(fd)
    # The lock files decide which uid a run gets; a directory someone else controls could
    # hand two runs the same uid.
    if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        raise SandboxError(f"slot directory {path} must be owned by uid {os.geteuid()}, 0700")
    return fd


def _try_lock(dir_fd: int, index: int) -> int | None:
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(f"slot-{index}.lock", flags, 0o600, dir_fd=dir_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


async def _acquire(config: SandboxConfig, deadline: float) -> tuple[Slot, int]:
    dir_fd = _open_slot_dir(config.slot_dir)
    try:
        while True:
            start = random.randrange(config.uid_slots)  # spread workers over the slots
            for offset in range(config.uid_slots):
                index = (start + offset) % config.uid_slots
                if (fd := _try_lock(dir_fd, index)) is not None:
                    return Slot(index=index, uid=config.uid_base + index), fd
            if time.monotonic() >= deadline:
                raise SandboxBusy(f"all {config.uid_slots} sandbox uid slots are busy")
            await asyncio.sleep(0.05)
    finally:
        os.close(dir_fd)


@contextlib.asynccontextmanager
async def uid_slot(config: SandboxConfig, deadline: float) -> AsyncIterator[Slot | None]:
    """A host uid that no other run uses until the block exits (None when not root).

    The flock lives as long as the descriptor, so a worker that crashes frees its slot; the
    processes it left behind are killed by the next holder before it starts.
    """
    if os.geteuid() != 0:
        yield None
        return
    slot, lock_fd = await _acquire(config, deadline)
    try:
        if os.pread(lock_fd, 16, 0) != _CLEAN:
            slot.was_dirty = True
            await sweep(RunScope(root_pid=-1, pgid=-1, uid=slot.uid))
        _mark(lock_fd, _BUSY)
        yield slot
    finally:
        if slot.clean:
            _mark(lock_fd, _CLEAN)
        os.close(lock_fd)


def _mark(lock_fd: int, state: bytes) -> None:
    os.ftruncate(lock_fd, 0)
    os.pwrite(lock_fd, state, 0)


def reap_stale_slots(config: SandboxConfig) -> list[Slot]:
    """Sweep every free slot whose last holder did not finish cleanly (root only).

    For a worker's start-up: a worker killed mid-run leaves a dirty slot whose processes
    ``--die-with-parent`` has normally taken down already, and a run directory on disk. Slots
    held by live runs are skipped. Returns the reaped slots (callers remove their run dirs).
    """
    if os.geteuid() != 0:
        return []
    reaped = []
    dir_fd = _open_slot_dir(config.slot_dir)
    try:
        for index in range(config.uid_slots):
            if (fd := _try_lock(dir_fd, index)) is None:
                continue
            try:
                if os.pread(fd, 16, 0) != _CLEAN:
                    slot = Slot(index=index, uid=config.uid_base + index)
                    if sweep_sync(RunScope(root_pid=-1, pgid=-1, uid=slot.uid)) == 0:
                        _mark(fd, _CLEAN)
                        reaped.append(slot)
            finally:
                os.close(fd)
    finally:
        os.close(dir_fd)
    return reaped


def probe_uid(config: SandboxConfig) -> int:
    """The uid the availability probe runs as: just past the slots, never handed to a run."""
    return config.uid_base + config.uid_slots

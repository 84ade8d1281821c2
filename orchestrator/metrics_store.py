"""Where every process of a host keeps its Prometheus counters: ``settings.METRICS_DIR``.

prometheus_client's multiprocess mode gives each process its own memory-mapped files
(``counter_<pid>.db``, ``histogram_<pid>.db``) in one folder, and a scrape adds them up, so the
web process's ``/metrics`` shows the counters of the workers that share its folder. The mode is
chosen before the first metric exists: :func:`metrics_store_enable` runs when
``orchestrator.metrics`` is imported.

A process that ends leaves its files behind. So that the folder does not grow with every
restart, the files of processes that are gone are folded into ``<kind>_archive.db`` (the sums
a scrape shows do not change), at a process's exit and when a process starts (a killed one
never reached its exit). Folding and scraping exclude each other (``flock`` on ``.lock``): a
scrape never sees a dead process's counts twice or not at all. The pids in the file names
must be those of one host (one pid namespace).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from django.conf import settings
from prometheus_client import values
from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

ENV = "PROMETHEUS_MULTIPROC_DIR"
_ARCHIVE = "archive"
_enabled: Path | None = None


def metrics_dir() -> Path:
    """The folder this process writes its counters to (created on first use)."""
    return Path(settings.METRICS_DIR)


def metrics_store_enable() -> Path:
    """Put prometheus_client in multiprocess mode on :func:`metrics_dir` (idempotent); fold
    in the files of processes that are gone; fold in this one's at its exit."""
    global _enabled
    if _enabled is not None:
        return _enabled
    folder = metrics_dir()
    folder.mkdir(parents=True, exist_ok=True)
    # Child processes (the workers ``manage.py up`` or a test starts) inherit the folder.
    os.environ[ENV] = str(folder)
    if not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.MultiProcessValue()  # imported before the variable was set
    dead_processes_fold(folder)
    atexit.register(_at_exit, folder)
    _enabled = folder
    return folder


@contextlib.contextmanager
def _locked(folder: Path, *, exclusive: bool) -> Iterator[None]:
    with open(folder / ".lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def _owner(path: Path) -> tuple[str, int] | None:
    """``(kind, pid)`` of a process's file (``counter_123.db`` → ``("counter", 123)``)."""
    kind, _, pid = path.stem.rpartition("_")
    return (kind, int(pid)) if pid.isdigit() and kind else None


def _fold(path: Path, kind: str, folder: Path) -> None:
    if kind.startswith("gauge"):
        path.unlink(missing_ok=True)  # a gone process's gauges mean nothing any more
        return
    archive = MmapedDict(str(folder / f"{kind}_{_ARCHIVE}.db"))
    try:
        for key, value, _timestamp, _pos in MmapedDict.read_all_values_from_file(str(path)):
            total, _ = archive.read_value(key)
            archive.write_value(key, total + value, 0.0)
    finally:
        archive.close()
    path.unlink()


def dead_processes_fold(folder: Path, *, also: Iterable[int] = ()) -> int:
    """Fold the files of processes that are gone (and of ``also``) into the archive files;
    returns how many files were folded."""
    forced = set(also)
    folded = 0
    with _locked(folder, exclusive=True):
        for path in sorted(folder.glob("*.db")):
            owner = _owner(path)
            if owner is None or (owner[1] not in forced and _alive(owner[1])):
                continue
            _fold(path, owner[0], folder)
            folded += 1
    return folded


def process_exited(pid: int, folder: Path | None = None) -> None:
    """Process ``pid`` ended (or is about to): its live gauges go, its counts are archived.
    (A count it still makes afterwards lands in its unlinked file and is lost.)"""
    folder = folder or metrics_dir()
    mark_process_dead(pid, str(folder))
    dead_processes_fold(folder, also=[pid])


def _at_exit(folder: Path) -> None:
    # The pid at exit, not at registration: a forked child inherits this handler.
    with contextlib.suppress(OSError):
        process_exited(os.getpid(), folder)


class HostCollector(Collector):
    """The summed counters of every process of this host (live and archived), read while
    no file is being folded."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def collect(self) -> Iterable[Metric]:
        with _locked(self.folder, exclusive=False):
            files = [str(path) for path in self.folder.glob("*.db")]
            return list(MultiProcessCollector.merge(files, accumulate=True))


__all__ = [
    "HostCollector",
    "dead_processes_fold",
    "metrics_dir",
    "metrics_store_enable",
    "process_exited",
]

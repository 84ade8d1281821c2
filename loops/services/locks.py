"""Path locks on ``actingOn``: two runs never act on overlapping paths of one repository.

Acquisition is serialised per database (a table lock on PostgreSQL, the single writer on
SQLite): it happens once per run start, so the coarse lock costs nothing measurable and makes
the conflict check race-free.
"""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Iterable
from typing import Any

from django.db import connection, transaction

from loops.models import LoopRun, PathLock, RunStatus
from loops.services.nudges import nudge_run
from loops.state import TERMINAL
from orchestrator.sql import time_now


def normalize_path(path: str) -> str:
    """``src/./a/`` → ``src/a``; the repository root is ``""``; refuses escaping paths."""
    cleaned = posixpath.normpath(path.strip().lstrip("/") or ".")
    if cleaned == ".." or cleaned.startswith("../"):
        raise ValueError(f"path escapes the repository: {path!r}")
    return "" if cleaned == "." else cleaned


def paths_conflict(a: str, b: str) -> bool:
    """Equal paths, or one inside the other (the root contains everything)."""
    if a == b or a == "" or b == "":
        return True
    return a.startswith(b + "/") or b.startswith(a + "/")


def find_conflicts(wanted: Iterable[str], held: Iterable[str]) -> list[tuple[str, str]]:
    held_list = list(held)
    return [(w, h) for w in wanted for h in held_list if paths_conflict(w, h)]


@transaction.atomic
def path_locks_acquire(
    *, run_id: uuid.UUID, repository_key: str, paths: list[str]
) -> list[dict[str, str]]:
    """Take every path or none. Returns the conflicts (empty when the locks are held)."""
    wanted = sorted({normalize_path(p) for p in paths})
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("LOCK TABLE loops_pathlock IN SHARE ROW EXCLUSIVE MODE")
    others = list(
        PathLock.objects.filter(repository_key=repository_key)
        .exclude(run_id=run_id)
        .values_list("path", "run_id")
    )
    holders = dict(others)
    conflicts = [
        {"path": w, "held": h, "run": str(holders[h])} for w, h in find_conflicts(wanted, holders)
    ]
    if conflicts:
        return conflicts
    mine = set(
        PathLock.objects.filter(run_id=run_id, repository_key=repository_key).values_list(
            "path", flat=True
        )
    )
    PathLock.objects.bulk_create(
        [
            PathLock(run_id=run_id, repository_key=repository_key, path=p)
            for p in wanted
            if p not in mine
        ]
    )
    return []


def lock_wait_detail(conflicts: list[dict[str, str]]) -> dict[str, Any]:
    """What a run waiting for path locks waits on (its wait record's ``detail``): the paths it
    wants that are held, the held paths, the runs holding them, and each conflict."""
    return {
        "paths": sorted({c["path"] for c in conflicts}),
        "held": sorted({c["held"] for c in conflicts}),
        "held_by": sorted({c["run"] for c in conflicts}),
        "conflicts": conflicts,
    }


def path_locks_release(*, run_id: uuid.UUID) -> list[str]:
    """Drop the run's locks and wake runs waiting for a lock on the same repository."""
    repos = list(PathLock.objects.filter(run_id=run_id).values_list("repository_key", flat=True))
    if not repos:
        return []
    PathLock.objects.filter(run_id=run_id).delete()
    _wake_lock_waiters(set(repos))
    return repos


def _wake_lock_waiters(repository_keys: set[str]) -> None:
    waiting = list(
        LoopRun.objects.filter(
            status=RunStatus.WAITING_LOCK,
            repository_snapshot__repositoryKey__in=list(repository_keys),
        ).values_list("id", flat=True)[:50]
    )
    # Make them due now rather than at their next retry time, then wake a worker.
    LoopRun.objects.filter(id__in=waiting, status=RunStatus.WAITING_LOCK).update(
        not_before=time_now()
    )
    for run_id in waiting:
        nudge_run(run_id)


def path_locks_sweep() -> int:
    """Free locks whose run has ended (belt and braces: transitions already release them)."""
    stale = PathLock.objects.filter(run__status__in=[s.value for s in TERMINAL])
    repos = set(stale.values_list("repository_key", flat=True))
    count, _ = stale.delete()
    if repos:
        _wake_lock_waiters(repos)
    return count

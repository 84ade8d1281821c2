"""Path locks on ``actingOn``: two runs never act on overlapping paths of one repository.

Acquisition is serialised per database (a table lock on PostgreSQL, the single writer on
SQLite): it happens once per run start, so the coarse lock costs nothing measurable and makes
the conflict check race-free. Locks are granted in arrival order: a run does not take paths
that a run waiting longer for them (an earlier lock wait) also wants, so a stream of newcomers
cannot starve a waiting run. Waiters only ever wait on holders or on older waiters, so the
waits form no cycle.
"""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils.dateparse import parse_datetime

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


def lock_wait_since(wait: Mapping[str, Any] | None) -> datetime | None:
    """When the lock wait of a run with this wait record started (None: no lock wait)."""
    if not wait or wait.get("kind") != "lock" or not wait.get("since"):
        return None
    return parse_datetime(str(wait["since"]))


def waits_ahead(mine: tuple[datetime | None, str], theirs: tuple[datetime | None, str]) -> bool:
    """Whether a lock wait that started at ``theirs`` (time, run id) comes before ``mine``: the
    earlier wait first, the run id breaking a tie; a run not yet waiting (None) comes last."""
    if theirs[0] is None:
        return False
    if mine[0] is None:
        return True
    return (theirs[0], theirs[1]) < (mine[0], mine[1])


@transaction.atomic
def path_locks_acquire(
    *,
    run_id: uuid.UUID,
    repository_key: str,
    paths: list[str],
    wait: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Take every path or none. Returns the conflicts (empty when the locks are held): paths
    held by another run, and paths wanted by a run whose lock wait started before this run's
    (``wait``, its wait record; a run not waiting for locks yet comes after every waiter),
    marked ``ahead``."""
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
    conflicts: list[dict[str, Any]] = [
        {"path": w, "held": h, "run": str(holders[h])} for w, h in find_conflicts(wanted, holders)
    ]
    conflicts += _queued_ahead(run_id, repository_key, wanted, lock_wait_since(wait))
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


def _queued_ahead(
    run_id: uuid.UUID, repository_key: str, wanted: list[str], waiting_since: datetime | None
) -> list[dict[str, Any]]:
    """The conflicts with runs of the repository that have waited for their locks longer."""
    waiting = (
        LoopRun.objects.filter(
            status=RunStatus.WAITING_LOCK, repository_snapshot__repositoryKey=repository_key
        )
        .exclude(id=run_id)
        .values_list("id", "repository_snapshot", "wait")
    )
    mine = (waiting_since, str(run_id))
    ahead: list[dict[str, Any]] = []
    for other_id, snapshot, wait in waiting:
        if not waits_ahead(mine, (lock_wait_since(wait), str(other_id))):
            continue
        theirs = {normalize_path(p) for p in (snapshot or {}).get("actingOn") or []}
        ahead += [
            {"path": w, "held": t, "run": str(other_id), "ahead": True}
            for w, t in find_conflicts(wanted, sorted(theirs))
        ]
    return ahead


def lock_wait_detail(conflicts: list[dict[str, Any]]) -> dict[str, Any]:
    """What a run waiting for path locks waits on (its wait record's ``detail``): the paths it
    wants that are taken, the held paths and the runs holding them, the runs that waited
    longer for some of the same paths (``ahead``, served first), and each conflict."""
    held = [c for c in conflicts if not c.get("ahead")]
    return {
        "paths": sorted({c["path"] for c in conflicts}),
        "held": sorted({c["held"] for c in held}),
        "held_by": sorted({c["run"] for c in held}),
        "ahead": sorted({c["run"] for c in conflicts if c.get("ahead")}),
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

"""Where a run's makers work: a ``git worktree`` of the pattern's repository at ``baseRef``, or
an empty scratch directory when the pattern names no repository.

The worktree is the run's own checkout, so file tools confined to it cannot touch the
repository or another run; its diff against ``baseRef`` becomes the run's artifact.

A root worker lends the workspace to a sandbox uid while ``bash`` runs (docs/sandbox.md); a
worker killed meanwhile leaves it lent, which git refuses ("dubious ownership").
:func:`workspace_reclaim` gives it back, at the start of every attempt and before git reads it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator.paths import workspaces_root
from sandbox import SandboxConfig, workdir_lent, workdir_reclaim


class WorkspaceError(Exception):
    """The workspace could not be prepared (bad repository, unknown ref)."""


def _git(*args: str, cwd: str | Path) -> str:
    result = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    if result.returncode != 0:
        raise WorkspaceError(f"git {' '.join(args[:2])} failed: {result.stderr.strip()[:500]}")
    return result.stdout


def workspace_path(run_id: uuid.UUID) -> Path:
    return workspaces_root() / str(run_id)


def workspace_ensure(run_id: uuid.UUID, repository: dict[str, Any]) -> str:
    """Create the run's workspace if it does not exist yet (idempotent: resumes reuse it).

    Worktrees of one repository are added one at a time (concurrent ``git worktree add``s read
    each other's half-written admin files and fail), and one that a killed worker left half
    made is made again."""
    path = workspace_path(run_id)
    root = repository.get("repositoryRoot") or ""
    if path.exists() and (not root or _worktree_complete(path)):
        return str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not root:
        path.mkdir(exist_ok=True)
        return str(path)
    if not (Path(root) / ".git").exists():
        raise WorkspaceError(f"repositoryRoot {root!r} is not a git repository")
    base = repository.get("baseRef") or "HEAD"
    with _repository_lock(root):
        if _worktree_complete(path):
            return str(path)
        force: list[str] = []
        if path.exists():
            # Half made: its admin dir may stay registered and locked ("initializing").
            shutil.rmtree(path)
            force = ["-f", "-f"]
        _git("worktree", "add", *force, "--detach", str(path), base, cwd=root)
    return str(path)


def _worktree_complete(path: Path) -> bool:
    """Did ``git worktree add`` finish this worktree? git writes its ``.git`` file, checks the
    files out, then removes the ``locked`` file it put in the admin dir while initializing."""
    try:
        pointer = (path / ".git").read_text()
    except OSError:
        return False
    if not pointer.startswith("gitdir:"):
        return False
    return not (Path(pointer.split(":", 1)[1].strip()) / "locked").exists()


@contextlib.contextmanager
def _repository_lock(root: str) -> Iterator[None]:
    """An exclusive lock on the repository's ``.git`` among every worker on this host."""
    fd = os.open(os.path.join(root, ".git"), os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _sandbox_uids() -> range:
    """The uids a workspace may be lent to: only a root worker lends (dedicated uids)."""
    return SandboxConfig.from_env().sandbox_uids() if os.geteuid() == 0 else range(0)


def workspace_lent(path: str | Path) -> bool:
    """Is the workspace still lent to a sandbox uid (a worker killed during ``bash``)?"""
    return workdir_lent(path, _sandbox_uids())


def workspace_reclaim(path: str | Path) -> int:
    """Give the workspace back to the service user wherever a sandbox uid still owns it;
    returns the entries changed (0 after one ``lstat`` when it is not lent)."""
    return workdir_reclaim(path, _sandbox_uids())


def workspace_diff(run_id: uuid.UUID, repository: dict[str, Any]) -> str:
    """The run's changes against ``baseRef`` (new files included), as a unified diff."""
    path = workspace_path(run_id)
    if not repository.get("repositoryRoot") or not path.exists():
        return ""
    workspace_reclaim(path)
    _git("add", "--all", cwd=path)
    return _git("diff", "--cached", "--no-color", repository.get("baseRef") or "HEAD", cwd=path)

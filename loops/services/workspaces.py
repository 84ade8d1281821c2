"""Where a run's makers work: a ``git worktree`` of the pattern's repository at ``baseRef``, or
an empty scratch directory when the pattern names no repository.

The worktree is the run's own checkout, so file tools confined to it cannot touch the
repository or another run; its diff against ``baseRef`` becomes the run's artifact.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings


class WorkspaceError(Exception):
    """The workspace could not be prepared (bad repository, unknown ref)."""


def _git(*args: str, cwd: str | Path) -> str:
    result = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    if result.returncode != 0:
        raise WorkspaceError(f"git {' '.join(args[:2])} failed: {result.stderr.strip()[:500]}")
    return result.stdout


def workspaces_root() -> Path:
    """The folder of every run's workspace."""
    return Path(settings.VAR_DIR) / "workspaces"


def workspace_path(run_id: uuid.UUID) -> Path:
    return workspaces_root() / str(run_id)


def workspace_ensure(run_id: uuid.UUID, repository: dict[str, Any]) -> str:
    """Create the run's workspace if it does not exist yet (idempotent: resumes reuse it)."""
    path = workspace_path(run_id)
    if path.exists():
        return str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    root = repository.get("repositoryRoot") or ""
    if not root:
        path.mkdir()
        return str(path)
    if not (Path(root) / ".git").exists():
        raise WorkspaceError(f"repositoryRoot {root!r} is not a git repository")
    base = repository.get("baseRef") or "HEAD"
    _git("worktree", "add", "--detach", str(path), base, cwd=root)
    return str(path)


def workspace_diff(run_id: uuid.UUID, repository: dict[str, Any]) -> str:
    """The run's changes against ``baseRef`` (new files included), as a unified diff."""
    path = workspace_path(run_id)
    if not repository.get("repositoryRoot") or not path.exists():
        return ""
    _git("add", "--all", cwd=path)
    return _git("diff", "--cached", "--no-color", repository.get("baseRef") or "HEAD", cwd=path)

"""Where the service keeps its files: everything lives under ``settings.VAR_DIR``
(``LOOPWRIGHT_VAR_DIR``), each kind in one directory named here."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings


def workspaces_root() -> Path:
    """The run workspaces, one git worktree per run (``<root>/<run id>``); skill folders may
    neither lie in it nor contain it."""
    return Path(settings.VAR_DIR) / "workspaces"

"""Git repositories for tests that run in a workspace: one commit on ``main``."""

from __future__ import annotations

import subprocess
from pathlib import Path


def committed_repository(path: Path, files: dict[str, str]) -> Path:
    """A repository at ``path`` whose ``main`` holds ``files`` (relative path → text)."""
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    for args in (
        ["init", "-q", "-b", "main"],
        ["add", "."],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first"],
    ):
        subprocess.run(["git", *args], cwd=path, check=True)
    return path

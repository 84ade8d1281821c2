"""Run workspaces as git worktrees: made concurrently by many workers without git tripping over
its own half-written admin files, made again when a killed worker left one half made, and
given back to the service user when a killed ``bash`` left one lent to a sandbox uid."""

from __future__ import annotations

import os
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from loops.services.workspaces import (
    workspace_diff,
    workspace_ensure,
    workspace_lent,
    workspace_path,
    workspace_reclaim,
)
from sandbox import SandboxConfig
from tests.support.bash_chaos import foreign_entries, git_refusal, git_repository


@pytest.fixture
def repo(tmp_path: Path) -> Any:
    with override_settings(VAR_DIR=tmp_path / "var"):
        root = git_repository(tmp_path / "repo")
        yield {"repositoryRoot": str(root), "baseRef": "main"}


def test_many_worktrees_of_one_repository_are_made_at_once(repo: dict[str, Any]) -> None:
    runs = [uuid.uuid4() for _ in range(24)]
    with ThreadPoolExecutor(max_workers=12) as pool:
        made = list(pool.map(lambda run_id: workspace_ensure(run_id, repo), runs))
    assert made == [str(workspace_path(run_id)) for run_id in runs]
    for path in made:
        assert (Path(path) / "README").read_text() == "hello\n"
        assert git_refusal(Path(path)) == ""


def test_a_worktree_a_killed_worker_left_half_made_is_made_again(repo: dict[str, Any]) -> None:
    run_id = uuid.uuid4()
    path = Path(workspace_ensure(run_id, repo))
    # What a kill during `git worktree add` leaves: the admin dir still locked while it
    # initialises, the checkout incomplete.
    admin = Path((path / ".git").read_text().split(":", 1)[1].strip())
    (admin / "locked").write_text("initializing")
    (path / "README").unlink()
    assert workspace_ensure(run_id, repo) == str(path)
    assert (path / "README").read_text() == "hello\n"
    assert git_refusal(path) == ""
    assert workspace_diff(run_id, repo) == ""  # nothing of the broken checkout is a change


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root worker lends workspaces")
def test_a_workspace_lent_to_a_sandbox_uid_is_given_back_links_untouched(
    repo: dict[str, Any], tmp_path: Path
) -> None:
    run_id = uuid.uuid4()
    path = Path(workspace_ensure(run_id, repo))
    lent_uid = SandboxConfig.from_env().uid_base + 1
    (path / "sub").mkdir()
    (path / "sub" / "new.txt").write_text("made by the command\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    os.chown(outside, lent_uid, lent_uid)  # a sandbox-owned file outside: never followed to
    (path / "link").symlink_to(outside)
    for entry in (path, path / "README", path / "sub", path / "sub" / "new.txt"):
        os.chown(entry, lent_uid, lent_uid)
    os.chown(path / "link", lent_uid, lent_uid, follow_symlinks=False)
    assert workspace_lent(path)
    assert "dubious ownership" in git_refusal(path)

    assert workspace_reclaim(path) == 5
    assert not workspace_lent(path) and foreign_entries(path) == []
    assert os.stat(outside).st_uid == lent_uid
    assert workspace_reclaim(path) == 0  # one lstat when nothing is lent
    assert "sub/new.txt" in workspace_diff(run_id, repo)
    subprocess.run(["git", "status"], cwd=path, check=True, capture_output=True)

"""Run directories live in a work root shared by every process of the host (``/tmp`` by
default): cleaning one never touches the root itself, nor another uid range's directories."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

from sandbox.types import SandboxRequest
from sandbox.workdir import rundir_create, rundir_remove, rundirs_remove_stale


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _shared_root(tmp_path: Path) -> Path:
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o1777)
    return root


def test_removing_a_run_directory_that_is_already_gone_leaves_the_work_root_alone(
    tmp_path: Path,
) -> None:
    root = _shared_root(tmp_path)
    rundir = rundir_create(
        work_root=str(root), request=SandboxRequest(language="python", code="1"), owner=None
    )
    shutil.rmtree(rundir.root)  # swept meanwhile, e.g. by a stale-slot reaper

    rundir_remove(rundir)

    assert _mode(root) == 0o1777


def test_a_stale_sweep_removes_only_the_run_directories_of_its_own_uid(tmp_path: Path) -> None:
    root = _shared_root(tmp_path)
    request = SandboxRequest(language="python", code="1")
    # Two uid ranges (say the S1 battery's and the service's) share slot index 4.
    mine = rundir_create(work_root=str(root), request=request, owner=None, uid=1_500_000_004)
    theirs = rundir_create(work_root=str(root), request=request, owner=None, uid=1_600_000_004)

    rundirs_remove_stale(str(root), 1_500_000_004)

    assert not mine.root.exists()
    assert theirs.root.exists() and theirs.code.exists()
    rundir_remove(theirs)
    assert _mode(root) == 0o1777 and not list(root.iterdir())

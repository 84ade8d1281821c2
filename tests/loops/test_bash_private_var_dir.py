"""``bash`` works wherever the checkout lives: a run whose var directory (hence its workspace)
sits under a 0700 directory runs its command, and git reads what the command made.

The engine runs in this process (``drive_run``, the tool loop, the production role policy),
with the real ``bash`` tool in a real sandbox and a real git worktree as the workspace; only
the model is scripted in-process. As root the sandbox runs as a dedicated uid that cannot
search the 0700 parent: it reaches the workspace through the run's private mount namespace.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from django.db import DEFAULT_DB_ALIAS, connections
from django.test import override_settings

from loops.models import LoopArtifact, LoopRun, LoopStep
from loops.services.claims import run_claim
from loops.services.runs import run_trigger
from loops.services.workspaces import workspace_path
from loops.worker.engine import drive_run
from runtime.tools import DirectoryLedger, ToolRegistry
from runtime.tools.bash import BashConfig, bash_tool
from tests.support.approvals import (
    InlineDriver,
    RoleScript,
    ScriptedRoleInvoker,
    approval_pattern,
)
from tests.support.bash_chaos import (
    PASSED,
    autonomous_on,
    foreign_entries,
    git_refusal,
    git_repository,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("seeded_profiles")]
COMMAND = "echo from-bash > made.txt; id -u; ls -a .. | tr '\\n' ' '"


@pytest.fixture
def private_var() -> Iterator[Path]:
    """A var directory under a 0700 parent (a checkout in a home directory)."""
    private = Path(tempfile.mkdtemp(prefix="lw-private-"))
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o700
    var = private / "var"
    var.mkdir()
    with override_settings(VAR_DIR=var):
        yield var
    shutil.rmtree(private)


def _drive(run_id: Any, invoker: ScriptedRoleInvoker) -> str:
    [claim] = run_claim(owner="inline", lease_seconds=300, run_id=run_id)
    outer = connections[DEFAULT_DB_ALIAS]

    async def main() -> None:
        connections[DEFAULT_DB_ALIAS] = outer  # the engine writes in the test's transaction
        await drive_run(InlineDriver(invoker), claim)  # type: ignore[arg-type]

    with mock.patch.dict(os.environ, {"DJANGO_ALLOW_ASYNC_UNSAFE": "true"}):
        asyncio.run(main())
    return str(LoopRun.objects.get(pk=run_id).status)


def test_bash_runs_in_a_workspace_under_a_0700_directory_and_git_reads_its_files(
    private_var: Path, tmp_path: Path
) -> None:
    bash = bash_tool(BashConfig(ledger=DirectoryLedger(private_var / "tool-ledger")))
    assert bash is not None, "the sandbox must run here"
    # bash is high-risk: only autonomy L3 (a repository identity and a worktree) runs it ungated.
    pattern = approval_pattern("private-var", **autonomous_on(git_repository(tmp_path / "repo")))
    inputs = {"label": "private", "rounds": [[["bash", {"command": COMMAND}]]]}
    run = run_trigger(pattern=pattern, actor="test", inputs=inputs)

    status = _drive(run.id, ScriptedRoleInvoker(RoleScript(), ToolRegistry([bash])))

    final = LoopRun.objects.get(pk=run.id)
    assert (status, final.terminal_reason) == PASSED, final.failure_reason  # L3: a human accepts
    [step] = LoopStep.objects.filter(run=run, kind="tool", name="bash")
    content = step.response["content"]
    assert content.startswith("exit code: 0"), content
    assert "stdout:\n65534\n" in content  # the sandbox's own unprivileged user
    # Above /workdir the sandbox sees its own root, not the private directory's content.
    assert "var" not in content.split("stdout:", 1)[1]
    workdir = workspace_path(run.id)
    assert str(workdir).startswith(str(private_var))
    assert (workdir / "made.txt").read_text() == "from-bash\n"
    assert foreign_entries(workdir) == []
    assert git_refusal(workdir) == ""
    assert "made.txt" in LoopArtifact.objects.get(run_id=run.id, kind="diff").content

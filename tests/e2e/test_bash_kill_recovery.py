"""A worker SIGKILLed while its ``bash`` command runs: the run resumes on another worker and
succeeds, and the workspace the command had borrowed is the service user's again.

Real parts: two ``celery worker`` processes with the production AgentInvoker, ``celery beat``
running the reaper, the loopback model server, a git repository whose worktree is the run's
workspace, and the builtin ``bash`` tool in a real sandbox. The first worker is killed while
the command sleeps, so the workspace is still lent to the sandbox uid (git would refuse it,
"dubious ownership"); the next attempt gives it back, re-issues the call, which runs again with
the same idempotency key (the command had not finished: nothing was in the ledger), and the
command's effect, made once per key, happens once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loops.models import LoopArtifact, LoopEvent, LoopRun, LoopStep, RunStatus
from loops.services.runs import run_trigger
from tests.e2e.conftest import start_beat, start_worker
from tests.support.bash_chaos import (
    bash_pattern,
    foreign_entries,
    git_refusal,
    git_repository,
    lent,
    lines,
    script_reply,
    start_approver,
    workspace_of,
)
from tests.support.chaos import log_tails, owner_prefix
from tests.support.model_server import ModelServer
from tests.support.workers import WorkerProcess, wait_for

pytestmark = [
    pytest.mark.one_backend,
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
    pytest.mark.timeout(600),
]
AGENT = {
    "LOOPWRIGHT_INVOKER": "loops.worker.invoker.AgentInvoker",
    "LOOPWRIGHT_LEASE_SECONDS": "4",
    "LOOPWRIGHT_HEARTBEAT_SECONDS": "1",
}
WAIT = 240
SLEEP = 6.0


@pytest.fixture
def model() -> Iterator[ModelServer]:
    with ModelServer() as server:
        server.always(script_reply(SLEEP))
        yield server
    server.check()


def test_a_worker_killed_during_bash_leaves_a_run_that_resumes_and_succeeds(
    tmp_path: Path, workers: list[WorkerProcess], procs: list[Any], model: ModelServer
) -> None:
    pattern = bash_pattern("bash-kill", model.url, git_repository(tmp_path / "repo"))
    start_approver(procs, pattern)  # bash is high-risk: at L1 a human approves each call
    start_beat(procs, tmp_path, 1.0)
    first = start_worker(workers, tmp_path, "first", **AGENT)
    run = run_trigger(pattern=pattern, actor="operator", inputs={"label": "kill"})
    workdir = workspace_of(run.id)

    wait_for(
        lambda: (workdir / "started.flag").exists(),
        timeout=WAIT,
        interval=0.05,
        message=log_tails(workers),
    )
    [bash_step] = LoopStep.objects.filter(run=run, kind="tool", name="bash")
    assert bash_step.status == "approved"  # a gated call runs as its approved step
    assert LoopRun.objects.get(pk=run.id).lease_owner.startswith(owner_prefix(first))
    first.kill()
    # What used to make the run unrecoverable: the workspace is still the sandbox uid's.
    assert lent(workdir), foreign_entries(workdir)
    assert "dubious ownership" in git_refusal(workdir)

    start_worker(workers, tmp_path, "second", **AGENT)
    wait_for(
        lambda: LoopRun.objects.get(pk=run.id).status in (RunStatus.SUCCEEDED, RunStatus.FAILED),
        timeout=WAIT,
        interval=0.5,
        message=log_tails([*workers, *procs]),
    )
    final = LoopRun.objects.get(pk=run.id)
    assert final.status == RunStatus.SUCCEEDED, (final.failure_reason, log_tails(workers))

    # The next attempt reclaimed the workspace before using it, and says so.
    types = list(LoopEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True))
    assert "workspace.reclaimed" in types and "lease.expired" in types
    assert "driver.error" not in types
    # The call was re-issued under the same step and key: run again (it had not finished),
    # its effect made once.
    steps = list(LoopStep.objects.filter(run=run, kind="tool", name="bash"))
    assert [(s.seq, s.status) for s in steps] == [(bash_step.seq, "completed")]
    assert "attempts=2" in steps[0].response["content"]
    attempts, effects = lines(workdir / "attempts.log"), lines(workdir / "effects.log")
    assert list(attempts.values()) == [2] and attempts.keys() == effects.keys()
    assert list(effects.values()) == [1]
    # Usable by the service user: every file its own, git reads it, the diff has the effect.
    assert foreign_entries(workdir) == []
    assert git_refusal(workdir) == ""
    diff = LoopArtifact.objects.get(run_id=run.id, kind="diff").content
    assert "effects.log" in diff and "attempts.log" in diff

"""A driver error on a claimed run is written to the run with its cause, and attempt
exhaustion says what really ended the attempts (worker deaths, driver errors, or both).

The services are tested on the real database; the driver end to end runs in this process
(real RunDriver, real git worktrees) with a workspace git refuses, and with one a killed
``bash`` left lent to a sandbox uid (reclaimed, so the run succeeds).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from loops.models import LoopArtifact, LoopEvent, LoopRun, RunStatus
from loops.services.claims import run_claim, runs_reap
from loops.services.claims_failures import describe_error, run_driver_error
from loops.services.workspaces import workspace_path
from loops.worker import driver as driver_module
from loops.worker.driver import RunDriver
from loops.worker.recovery import reclaim_workspace
from runtime.invocation import (
    InvocationOutcome,
    InvocationRequest,
    LoopRole,
    NothingToPrepare,
    OutcomeKind,
    StepJournal,
)
from sandbox import SandboxConfig
from tests.support.factories import make_pattern, make_run
from tests.support.workers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="only a root worker lends workspaces")


def _expire(run: LoopRun) -> None:
    LoopRun.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=5))


def _due_now(run: LoopRun) -> None:
    LoopRun.objects.filter(pk=run.pk).update(not_before=None)


def _claimed_state() -> str:
    """The state a claim leaves a run without repository in: the one-statement claim of
    PostgreSQL starts it at once, SQLite's leaves it preparing."""
    return "running" if connection.vendor == "postgresql" else "preparing"


def _claim(run: LoopRun, owner: str = "w1") -> Any:
    [claim] = run_claim(owner=owner, lease_seconds=60, run_id=run.id)
    return claim


def test_a_driver_error_is_an_event_and_a_delayed_retry_that_keeps_the_attempt_count() -> None:
    run = make_run(max_attempts=3)
    claim = _claim(run)
    status = run_driver_error(claim.lease, describe_error(ValueError("the tree is broken")))
    assert status == RunStatus.QUEUED
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.lease_owner is None
    assert run.attempts == 1  # no clean release: the streak goes on
    assert run.not_before is not None and run.not_before > timezone.now()
    event = LoopEvent.objects.get(run=run, type="driver.error")
    assert event.data["error"] == "ValueError: the tree is broken"
    assert event.data["attempt"] == 1 and event.data["retry_in_seconds"] == 2.0
    assert run_claim(owner="w2", lease_seconds=60, run_id=run.id) == []  # not due yet


def test_spent_attempts_fail_the_run_naming_the_error_and_the_deaths() -> None:
    run = make_run(max_attempts=3)
    run_driver_error(_claim(run).lease, "WorkspaceError: git add failed: dubious ownership")
    _due_now(run)
    _claim(run, "w2")
    _expire(run)
    assert runs_reap().requeued == [run.id]  # a death, attempts left
    status = run_driver_error(
        _claim(run, "w3").lease, "WorkspaceError: git add failed: dubious ownership"
    )
    assert status == RunStatus.FAILED
    run.refresh_from_db()
    assert run.terminal_reason == "driver_error"
    # The claim starts a run that needs no preparation on PostgreSQL: 'running' there.
    assert run.failure_reason == (
        "The run made 3 attempts without progress (limit 3 attempts in a row): the driver "
        "raised an error 2 times: WorkspaceError: git add failed: dubious ownership; the worker "
        f"died or was killed once (its lease expired); last state was '{_claimed_state()}'."
    )


def test_the_reaper_says_driver_errors_apart_from_deaths() -> None:
    only_deaths, mixed = make_run(max_attempts=2), make_run(max_attempts=2)
    _claim(only_deaths)
    _expire(only_deaths)
    assert runs_reap().requeued == [only_deaths.id]
    run_driver_error(_claim(mixed).lease, "RuntimeError: boom")
    _due_now(mixed)
    for run in (only_deaths, mixed):
        _claim(run, "w2")
        _expire(run)
    assert sorted(map(str, runs_reap().failed)) == sorted([str(only_deaths.id), str(mixed.id)])
    only_deaths.refresh_from_db()
    mixed.refresh_from_db()
    assert only_deaths.failure_reason.startswith(
        "The worker driving the run died or was killed 2 times in a row"
    )
    assert "driver" not in only_deaths.failure_reason
    assert mixed.terminal_reason == "lease_attempts_exhausted"
    assert "the driver raised an error once: RuntimeError: boom" in mixed.failure_reason
    assert "the worker died or was killed once" in mixed.failure_reason


def test_every_attempt_failing_on_errors_says_so_with_each_distinct_error() -> None:
    run = make_run(max_attempts=2)
    run_driver_error(_claim(run).lease, "OSError: disk full")
    _due_now(run)
    run_driver_error(_claim(run, "w2").lease, "RuntimeError: boom")
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.failure_reason == (
        "Every attempt failed (limit 2 attempts in a row): the driver raised an error 2 times: "
        f"RuntimeError: boom (once); OSError: disk full (once); last state was '{_claimed_state()}'."
    )


# --- the driver, end to end in this process ------------------------------------------------


class _Roles(NothingToPrepare):
    """Every role finishes at once; the maker first does ``on_maker(workdir)``."""

    def __init__(self, on_maker: Any) -> None:
        self.on_maker = on_maker

    async def invoke(
        self, request: InvocationRequest, journal: StepJournal, prepared: Any = None
    ) -> InvocationOutcome:
        output: dict[str, Any] = {"summary": "done"}
        if request.role == LoopRole.LEADER:
            output = {"tasks": [{"title": "do it"}]}
        elif request.role == LoopRole.VERIFIER:
            output = {"verdict": "pass", "reasons": ["scripted"], "checks": []}
        else:
            assert request.workdir
            self.on_maker(Path(request.workdir))
        return InvocationOutcome(kind=OutcomeKind.COMPLETED, output=output)


def _db_call_and_close(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    finally:
        connection.close()  # the test runner is no worker: no connections left behind


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README").write_text("hello\n")
    for args in (
        ["init", "-q", "-b", "main"],
        ["add", "README"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first"],
    ):
        subprocess.run(["git", *args], cwd=repo, check=True)
    return repo


@pytest.fixture
def drive(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[Any]:
    monkeypatch.setattr(driver_module, "_db_call", _db_call_and_close)
    settings.LOOPWRIGHT = {**settings.LOOPWRIGHT, "POLL_INTERVAL_SECONDS": 0.2}
    started: list[RunDriver] = []

    def start(on_maker: Any) -> RunDriver:
        driver = RunDriver(invoker=_Roles(on_maker), capacity=4, owner=f"t-{uuid.uuid4().hex[:6]}")
        driver.start()
        started.append(driver)
        return driver

    yield start
    for driver in started:
        driver.stop(drain_seconds=5)


def _run_on(repository: Path, max_attempts: int) -> LoopRun:
    pattern = make_pattern(repository_root=str(repository), base_ref="main")
    snapshot = {"repositoryKey": "", "repositoryRoot": str(repository), "baseRef": "main"}
    return make_run(pattern, repository_snapshot=snapshot, max_attempts=max_attempts)


def _ended(run: LoopRun) -> LoopRun:
    wait_for(
        lambda: LoopRun.objects.get(pk=run.pk).status in (RunStatus.SUCCEEDED, RunStatus.FAILED),
        timeout=60,
        interval=0.1,
        message=f"run {run.id} did not end: {list(LoopEvent.objects.filter(run=run).values())}",
    )
    return LoopRun.objects.get(pk=run.pk)


@ROOT_ONLY
def test_a_workspace_git_refuses_fails_the_run_with_gits_words_not_a_dead_worker(
    drive: Any, repository: Path
) -> None:
    # A workspace owned by a stranger (not a sandbox uid: nothing may repair it).
    run = _run_on(repository, max_attempts=2)
    drive(lambda workdir: os.chown(workdir, 4242, 4242))
    final = _ended(run)
    assert final.status == RunStatus.FAILED
    assert final.terminal_reason == "driver_error"
    assert "WorkspaceError: git add --all failed" in final.failure_reason
    assert "dubious ownership" in final.failure_reason
    assert "Every attempt failed (limit 2 attempts in a row)" in final.failure_reason
    errors = LoopEvent.objects.filter(run=run, type="driver.error").order_by("seq")
    assert [e.to_status for e in errors] == ["queued", "failed"]
    assert all("dubious ownership" in e.data["error"] for e in errors)
    assert not LoopEvent.objects.filter(run=run, type="lease.expired").exists()


@ROOT_ONLY
def test_a_workspace_left_lent_to_a_sandbox_uid_is_reclaimed_and_the_run_succeeds(
    drive: Any, repository: Path
) -> None:
    lent = SandboxConfig.from_env().uid_base + 7

    def leave_lent(workdir: Path) -> None:
        # What a worker killed during bash leaves: the tree still owned by the sandbox uid,
        # with a file the command made.
        (workdir / "made-by-bash.txt").write_text("x\n")
        for path in (workdir, workdir / "README", workdir / "made-by-bash.txt"):
            os.chown(path, lent, lent)

    run = _run_on(repository, max_attempts=1)
    drive(leave_lent)
    final = _ended(run)
    assert final.status == RunStatus.SUCCEEDED, final.failure_reason
    workdir = workspace_path(run.id)
    for path in (workdir, workdir / "README", workdir / "made-by-bash.txt"):
        assert (os.stat(path).st_uid, os.stat(path).st_gid) == (os.geteuid(), os.getegid())
    # git read the reclaimed workspace: the command's file is in the run's diff.
    assert "made-by-bash.txt" in LoopArtifact.objects.get(run_id=run.id, kind="diff").content


@ROOT_ONLY
def test_a_lent_workspace_is_reclaimed_at_the_start_of_an_attempt(repository: Path) -> None:
    """The attempt-start repair on its own: a run claimed again finds its workspace lent."""
    run = _run_on(repository, max_attempts=3)
    claim = _claim(run)
    workdir = workspace_path(run.id)
    workdir.mkdir(parents=True)
    (workdir / "left.txt").write_text("x")
    lent = SandboxConfig.from_env().uid_base + 2
    for path in (workdir, workdir / "left.txt"):
        os.chown(path, lent, lent)

    class _Db:
        async def db(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(_db_call_and_close, fn, *args, **kwargs)

    asyncio.run(reclaim_workspace(_Db(), claim.lease, str(workdir)))  # type: ignore[arg-type]
    assert os.stat(workdir / "left.txt").st_uid == os.geteuid()
    event = LoopEvent.objects.get(run=run, type="workspace.reclaimed")
    assert event.data == {"workdir": str(workdir)}

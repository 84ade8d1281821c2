"""``limits.recursionLimit``, ``limits.timeoutMs`` and ``isolation`` bind a real run through the
engine (``tests.support.limits.InlineEngine``: the production ``drive_run``, tool loop and
journal; a scripted model and recording tools), on the suite's database (SQLite or
PostgreSQL)."""

from __future__ import annotations

import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from loops.models import LoopEvent, LoopRun, RunStatus
from loops.services.harness_limits import working_seconds
from tests.loops.test_harness_limits import ended, harness_event, harness_run
from tests.support.bash_chaos import git_repository
from tests.support.fake_model import RecordingTool
from tests.support.limits import InlineEngine

# --- limits.recursionLimit -------------------------------------------------------------------


@pytest.mark.django_db
def test_recursion_limit_caps_model_steps_and_names_itself_when_the_invocation_runs_out() -> None:
    engine = InlineEngine(max_steps=200)  # the employee's own cap is far higher
    run, layer = harness_run({"limits": {"recursionLimit": 3}})
    assert engine.drive(run.id) == RunStatus.FAILED
    _, code, reason = ended(run)
    assert code == "harness_limit:limits.recursionLimit"
    assert reason.startswith(
        f"limits.recursionLimit = 3 (set by {layer}): the invocation ran out of model steps"
    )
    # Three steps offered tools, then the tool-less final step the loop always allows.
    assert engine.model.calls_by("maker") == 4 and engine.executed <= 3
    event = harness_event(run)
    assert (event.data["setting"], event.data["value"], event.data["layer"]) == (
        "limits.recursionLimit",
        3,
        layer,
    )


@pytest.mark.django_db
def test_the_employees_own_step_cap_applies_when_it_is_the_stricter() -> None:
    engine = InlineEngine(max_steps=3)
    run, _ = harness_run({"limits": {"recursionLimit": 10}})
    assert engine.drive(run.id) == RunStatus.FAILED
    assert ended(run)[1] == "empty_answer"
    assert engine.model.calls_by("maker") == 4


@pytest.mark.django_db
def test_a_recursion_limit_of_zero_allows_no_model_step() -> None:
    engine = InlineEngine()
    run, layer = harness_run({"limits": {"recursionLimit": 0}})
    assert engine.drive(run.id) == RunStatus.FAILED
    assert ended(run)[1:] == (
        "harness_limit:limits.recursionLimit",
        f"limits.recursionLimit = 0 (set by {layer}): no model step may run",
    )
    assert len(engine.model.requests) == 0


# --- limits.timeoutMs ------------------------------------------------------------------------


def slow_engine(seconds: float) -> InlineEngine:
    return InlineEngine(
        peek=RecordingTool("peek", sleep=seconds), probe=RecordingTool("probe", sleep=seconds)
    )


@pytest.mark.django_db
def test_timeout_ms_stops_an_invocation_at_the_runs_working_time() -> None:
    engine = slow_engine(0.1)
    run, layer = harness_run({"limits": {"timeoutMs": 1000}})
    began = time.monotonic()
    assert engine.drive(run.id) == RunStatus.FAILED
    assert time.monotonic() - began < 5
    _, code, reason = ended(run)
    assert code == "harness_limit:limits.timeoutMs"
    assert reason.startswith(f"limits.timeoutMs = 1000 (set by {layer}): the run worked ")
    event = harness_event(run)
    assert (event.data["setting"], event.data["value"], event.data["layer"]) == (
        "limits.timeoutMs",
        1000,
        layer,
    )
    assert 0.9 <= event.data["worked_seconds"] <= 3
    assert 3 <= engine.executed <= 12


def with_history(run: LoopRun, changes: list[tuple[str, float]]) -> None:
    """Give ``run`` earlier status changes (status, seconds ago) after its creation."""
    now = timezone.now()
    LoopEvent.objects.filter(run=run, seq=1).update(created_at=now - timedelta(seconds=500))
    for seq, (status, ago) in enumerate(changes, start=2):
        event = LoopEvent.objects.create(run=run, seq=seq, type="t", to_status=status)
        LoopEvent.objects.filter(pk=event.pk).update(created_at=now - timedelta(seconds=ago))
    LoopRun.objects.filter(pk=run.pk).update(event_seq=len(changes) + 1)


@pytest.mark.django_db
def test_time_parked_for_a_human_or_a_retry_does_not_count() -> None:
    """Worked 0.5 s, then parked 98.5 s waiting for approval and 1 s queued: well within a
    2 s limit, so the run goes on and finishes."""
    engine = InlineEngine()
    engine.model.stop.set()
    run, _ = harness_run({"limits": {"timeoutMs": 2000}})
    with_history(run, [("running", 100), ("waiting_approval", 99.5), ("queued", 1)])
    assert engine.drive(run.id) == RunStatus.SUCCEEDED


@pytest.mark.django_db
def test_a_run_that_already_worked_its_time_fails_before_its_next_invocation() -> None:
    engine = InlineEngine()
    engine.model.stop.set()
    run, layer = harness_run({"limits": {"timeoutMs": 2000}})
    with_history(run, [("running", 100), ("verifying", 98), ("blocked", 97), ("queued", 1)])
    assert engine.drive(run.id) == RunStatus.FAILED
    _, code, reason = ended(run)
    assert code == "harness_limit:limits.timeoutMs"
    assert reason.startswith(f"limits.timeoutMs = 2000 (set by {layer}): the run worked 3.")
    assert len(engine.model.requests) == 0


def test_working_seconds_count_running_and_verifying_only() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    at = [t0 + timedelta(seconds=s) for s in (0, 10, 12, 15, 40, 41, 100)]
    changes = [
        ("queued", at[0]),
        ("running", at[1]),
        ("verifying", at[2]),
        ("waiting_human", at[3]),
        ("queued", at[4]),
        ("running", at[5]),
    ]
    assert working_seconds(changes, at[6]) == pytest.approx(5 + 59)


# --- isolation -------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("isolation", "setting", "value"),
    [
        ({"requireWorktree": True}, "isolation.requireWorktree", "true"),
        ({"mode": "worktree"}, "isolation.mode", "worktree"),
    ],
)
def test_a_run_that_requires_a_worktree_without_a_repository_fails_at_start(
    isolation: dict[str, object], setting: str, value: str
) -> None:
    engine = InlineEngine()
    run, layer = harness_run({"isolation": isolation})
    assert engine.drive(run.id) == RunStatus.FAILED
    _, code, reason = ended(run)
    assert code == f"harness_limit:{setting}"
    assert reason.startswith(f"{setting} = {value} (set by {layer}) for the leader:")
    assert "no repository" in reason
    assert len(engine.model.requests) == 0
    event = harness_event(run)
    assert (event.data["setting"], event.data["layer"]) == (setting, layer)


@pytest.mark.django_db
def test_a_run_that_requires_a_worktree_works_in_its_git_worktree(tmp_path: Path) -> None:
    root = git_repository(tmp_path / "repo")
    engine = InlineEngine()
    engine.model.stop.set()
    run, _ = harness_run(
        {"isolation": {"mode": "worktree", "requireWorktree": True}},
        repository={"repositoryRoot": str(root), "baseRef": "main"},
    )
    assert engine.drive(run.id) == RunStatus.SUCCEEDED
    run.refresh_from_db()
    workdir = Path(run.cursor["workdir"])
    assert workdir != root and (workdir / ".git").is_file()  # a linked worktree
    top = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"], cwd=workdir, capture_output=True, text=True
    )
    assert Path(top.stdout.strip()).resolve() == workdir.resolve()
    listed = subprocess.run(
        ["git", "worktree", "list", "--porcelain"], cwd=root, capture_output=True, text=True
    ).stdout
    assert str(workdir.resolve()) in listed or str(workdir) in listed

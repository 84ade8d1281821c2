"""The ``loopwright`` CLI against a real server (pytest-django's live_server, in threads), in
process through ``main(argv)`` and once as a real subprocess through ``bin/loopwright``."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from loops.models import LoopRun, RunStatus
from loops.services.endings import run_transition
from orchestrator import cli
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import api_token_create, user_ensure
from tests.support.factories import make_pattern
from tests.support.workers import ROOT

# --- pure parts --------------------------------------------------------------------------------


def test_inputs_are_json_when_they_parse_and_strings_otherwise() -> None:
    assert cli.parse_inputs(["n=3", "flag=true", "path=docs/", 'obj={"a": 1}', "empty="]) == {
        "n": 3,
        "flag": True,
        "path": "docs/",
        "obj": {"a": 1},
        "empty": "",
    }


def test_an_input_without_equals_sign_is_an_error() -> None:
    with pytest.raises(cli.CliError, match="expected key=value"):
        cli.parse_inputs(["oops"])


def test_an_event_prints_on_one_line_with_time_type_move_actor_and_data() -> None:
    line = cli.format_event(
        {
            "seq": 3,
            "type": "lease.claimed",
            "from_status": "queued",
            "to_status": "preparing",
            "actor": "worker-1",
            "data": {"attempt": 1, "note": "x" * 200, "empty": ""},
            "created_at": "2030-01-07T09:00:05.123Z",
        }
    )
    assert line.startswith("09:00:05  #3  lease.claimed  queued→preparing  by worker-1  attempt=1")
    assert "empty=" not in line and len(line) < 200 and "\n" not in line


def test_a_missing_token_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("LOOPWRIGHT_TOKEN", raising=False)
    assert cli.main(["trigger", "anything"]) == 1
    assert "LOOPWRIGHT_TOKEN is not set" in capsys.readouterr().err


def test_an_unreachable_server_is_reported_with_the_url(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LOOPWRIGHT_TOKEN", "lw_x_y")
    monkeypatch.setenv("LOOPWRIGHT_URL", "http://127.0.0.1:9")  # discard port: refused
    assert cli.main(["watch", str(uuid.uuid4())]) == 1
    assert (
        "Cannot reach Loopwright at http://127.0.0.1:9 (LOOPWRIGHT_URL)" in capsys.readouterr().err
    )


# --- against a live server ---------------------------------------------------------------------

live = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server(
    live_server: Any, seeded_profiles: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    user = user_ensure(username="ops", roles=[Role.OPERATOR])
    env = {"LOOPWRIGHT_URL": live_server.url, "LOOPWRIGHT_TOKEN": api_token_create(user=user)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    yield env


def drive(
    pattern_key: str, path: list[RunStatus], fields: dict[str, Any] | None = None
) -> threading.Thread:
    """A stand-in worker: waits for the pattern's run, then moves it along ``path``."""

    def work() -> None:
        try:
            deadline = time.monotonic() + 30
            run = None
            while run is None and time.monotonic() < deadline:
                run = LoopRun.objects.filter(pattern__key=pattern_key).first()
                time.sleep(0.05)
            assert run is not None, "the CLI did not trigger a run"
            for n, status in enumerate(path):
                time.sleep(0.3)
                last = n == len(path) - 1
                run_transition(
                    run_id=run.id, to=status, actor="test-worker",
                    data={"step": n}, fields=(fields or {}) if last else None,
                )  # fmt: skip
        finally:
            connection.close()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


TO_SUCCESS = [RunStatus.PREPARING, RunStatus.RUNNING, RunStatus.VERIFYING, RunStatus.SUCCEEDED]


@live
def test_trigger_prints_the_new_run_and_passes_typed_inputs(
    server: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    pattern = make_pattern(goal_template="Fix {{ inputs.path }}")
    code = cli.main(["trigger", pattern.key, "--input", "path=docs/", "--input", "depth=2"])
    out = capsys.readouterr().out
    assert code == 0, out
    run = LoopRun.objects.get(pattern=pattern)
    assert f"run {run.id} of {pattern.key} is queued" in out and "goal: Fix docs/" in out
    assert f"  page: {server['LOOPWRIGHT_URL']}/runs/{run.id}" in out.splitlines()
    assert run.inputs == {"path": "docs/", "depth": 2} and run.triggered_by == "ops"


@live
def test_api_refusals_print_title_detail_and_field_errors(
    server: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    pattern = make_pattern(goal_template="Fix {{ inputs.path }}")
    assert cli.main(["trigger", pattern.key]) == 1
    err = capsys.readouterr().err
    assert "Invalid input: The goal template could not be rendered" in err
    assert "\n  inputs: " in err and "path" in err
    assert cli.main(["trigger", "no-such-pattern"]) == 1
    assert "Not found" in capsys.readouterr().err
    assert LoopRun.objects.count() == 0


@live
def test_trigger_watch_follows_the_run_to_success_and_exits_0(
    server: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    pattern = make_pattern(goal_template="Ship it")
    worker = drive(pattern.key, TO_SUCCESS, {"terminal_reason": "verified", "step_count": 4})
    code = cli.main(["trigger", pattern.key, "--watch"])
    worker.join(timeout=30)
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    for move in ("·→queued", "queued→preparing", "preparing→running", "running→verifying",
                 "verifying→succeeded"):  # fmt: skip
        assert sum(move in line for line in lines) == 1, (move, out)
    assert "by test-worker" in out and "step=3" in out
    assert "SUCCEEDED" in out and "reason: verified" in out and "4 steps" in out


@live
def test_watch_stops_at_a_run_parked_for_a_human_and_says_what_to_do(
    server: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    pattern = make_pattern(goal_template="Review")
    cli.main(["trigger", pattern.key])
    run = LoopRun.objects.get(pattern=pattern)
    worker = drive(pattern.key, [RunStatus.PREPARING, RunStatus.RUNNING, RunStatus.WAITING_HUMAN])
    code = cli.main(["watch", str(run.id)])
    worker.join(timeout=30)
    out = capsys.readouterr().out
    assert code == 2
    assert "WAITING_HUMAN" in out and f"POST /api/v1/runs/{run.id}/accept" in out


@live
def test_watch_of_a_failed_run_prints_the_failure_and_exits_2(
    server: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    pattern = make_pattern(goal_template="Try")
    cli.main(["trigger", pattern.key])
    run = LoopRun.objects.get(pattern=pattern)
    run_transition(
        run_id=run.id, to=RunStatus.FAILED, actor="test",
        fields={"terminal_reason": "verifier_rejected", "failure_reason": "tests fail"},
    )  # fmt: skip
    assert cli.main(["watch", str(run.id)]) == 2
    out = capsys.readouterr().out
    assert "FAILED" in out and "reason: verifier_rejected" in out and "failure: tests fail" in out


@live
def test_the_wrapper_script_runs_the_cli_as_a_real_process(server: dict[str, str]) -> None:
    pattern = make_pattern(goal_template="Count to {{ inputs.n }}")
    worker = drive(pattern.key, TO_SUCCESS)
    result = subprocess.run(
        [str(ROOT / "bin" / "loopwright"), "trigger", pattern.key, "--input", "n=3", "--watch"],
        env={**os.environ, **server}, capture_output=True, text=True, timeout=60, cwd="/",
    )  # fmt: skip
    worker.join(timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "goal: Count to 3" in result.stdout and "SUCCEEDED" in result.stdout
    assert LoopRun.objects.get(pattern=pattern).status == RunStatus.SUCCEEDED

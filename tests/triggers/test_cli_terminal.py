"""``bin/loopwright`` as a real process against the production ASGI app on loopback: approve and
reject a parked run's calls by approval or run id (the API's refusals printed), the summary's
tokens, cost (``cost unknown`` for unpriced models) and page link, and colour on a terminal or
forced, never when piped or with ``NO_COLOR`` / ``--no-color``."""

from __future__ import annotations

import os
import pty
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx2
import pytest

from loops.models import ActionApproval, ApprovalStatus, LoopRun
from loops.services.steps import step_record
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import api_token_create, user_ensure
from tests.observability.test_streams_api import (
    Server,
    _claimed,
    _finish,
    _model_step,
    asgi_server,
    stream_settings,
)
from tests.support.approvals import approval_pattern, park_directly, write_call
from tests.support.factories import make_pattern, make_run
from tests.support.workers import ROOT

__all__ = ["asgi_server", "stream_settings"]  # the API stream tests' fixtures

pytestmark = pytest.mark.django_db(transaction=True)

LOOPWRIGHT = str(ROOT / "bin" / "loopwright")
GREEN_APPROVED = "\x1b[32mapproved\x1b[0m"


def _env(server: Server, token: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TERM")}
    return env | {"LOOPWRIGHT_URL": server.url, "LOOPWRIGHT_TOKEN": token} | extra


def _cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    """The CLI with its output piped."""
    return subprocess.run(
        [LOOPWRIGHT, *argv], env=env, capture_output=True, text=True, timeout=60, cwd="/"
    )


def _cli_on_a_terminal(env: dict[str, str], *argv: str) -> tuple[int, str]:
    """The CLI with its standard output a pseudo-terminal: its exit code and what it showed."""
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [LOOPWRIGHT, *argv], env=env, stdout=follower, stderr=subprocess.PIPE, timeout=60
        )
    finally:
        os.close(follower)
    shown = b""
    try:
        while chunk := os.read(leader, 65536):
            shown += chunk
    except OSError:  # EIO: the terminal's other side is closed and read to its end
        pass
    finally:
        os.close(leader)
    return done.returncode, shown.decode() + done.stderr.decode()


def test_approve_and_reject_by_approval_or_run_id_as_a_real_process(asgi_server: Server) -> None:
    calls = [write_call("a.txt", "A"), write_call("b.txt", "B")]
    run = park_directly(approval_pattern("cli-terminal"), calls)
    first, second = ActionApproval.objects.filter(run=run).order_by("step_seq")
    approver = api_token_create(user=user_ensure(username="approver", roles=[Role.APPROVER]))
    env = _env(asgi_server, approver)

    operator = _cli(_env(asgi_server, asgi_server.token), "approve", str(first.id))
    assert operator.returncode == 1 and "Only approvers" in operator.stderr, operator.stderr
    several = _cli(env, "approve", str(run.id))
    assert several.returncode == 1
    assert f"argument ID: run {run.id} has 2 pending approvals" in several.stderr
    assert str(first.id) in several.stderr and str(second.id) in several.stderr
    bad = _cli(env | {"FORCE_COLOR": "1"}, "reject", "not-an-id")  # errors in red
    assert bad.returncode == 1, bad.stderr
    red = "\x1b[31mloopwright: argument ID: 'not-an-id' is not an approval or run id (a UUID)"
    assert bad.stderr.startswith(red), bad.stderr
    missing = _cli(env, "reject")
    assert missing.returncode == 1 and "the following arguments are required: ID" in missing.stderr

    rejected = _cli(env, "reject", str(first.id), "--reason", "not this file")
    assert rejected.returncode == 0, rejected.stderr
    assert rejected.stdout.startswith(f"approval {first.id} rejected: write ")
    assert f"{asgi_server.url}/runs/{run.id}" in rejected.stdout and "\x1b" not in rejected.stdout

    code, shown = _cli_on_a_terminal(env, "approve", str(run.id), "--reason", "fine")  # 1 left
    assert code == 0 and f"approval {second.id} {GREEN_APPROVED}: write " in shown, shown
    again = _cli(env, "approve", str(second.id))
    assert again.returncode == 1 and "argument ID: run" not in again.stderr
    assert f"approve {second.id}: Conflict" in again.stderr, again.stderr

    decided = {
        a.id: (a.status, a.decision_reason, a.decided_by) for a in ActionApproval.objects.all()
    }
    assert decided == {
        first.id: (ApprovalStatus.REJECTED, "not this file", "approver"),
        second.id: (ApprovalStatus.APPROVED, "fine", "approver"),
    }
    with httpx2.Client(headers={"Authorization": f"Bearer {approver}"}) as api:
        shown_run = api.get(f"{asgi_server.url}/api/v1/runs/{run.id}").json()
    assert shown_run["status"] == LoopRun.objects.get(pk=run.id).status == "queued"  # goes on


def _unpriced_step(lease: Any) -> None:
    step_record(
        lease, role="maker", invocation="maker-1", kind="model", name="local-llama",
        request={"messages": 1}, response={"content": "ok"}, tokens_in=50, tokens_out=5,
        cost=0, duration_ms=5,
    )  # fmt: skip


def test_the_summary_shows_tokens_cost_and_page_and_colour_only_where_wanted(
    asgi_server: Server,
) -> None:
    mixed, unpriced = make_run(make_pattern()), make_run(make_pattern())
    lease = _claimed(mixed.id)
    _model_step(lease, 1)  # 110 tokens, $0.01
    _unpriced_step(lease)
    _finish(lease)
    lease = _claimed(unpriced.id)
    _unpriced_step(lease)
    _finish(lease)
    env = _env(asgi_server, asgi_server.token)

    piped = _cli(env, "watch", str(mixed.id))
    assert piped.returncode == 0, piped.stderr
    lines = piped.stdout.splitlines()
    assert "  tokens 165, cost $0.0100 + unknown (unpriced model: local-llama)" in lines, lines
    assert lines.count(f"  page: {asgi_server.url}/runs/{mixed.id}") == 2
    assert any("local-llama  completed" in line and "cost unknown" in line for line in lines)
    assert "\x1b" not in piped.stdout
    alone = _cli(env, "watch", str(unpriced.id)).stdout.splitlines()
    assert "  tokens 55, cost unknown (unpriced model: local-llama)" in alone, alone

    cases = [
        (True, {"FORCE_COLOR": "1"}, []),
        (True, {"NO_COLOR": "1"}, ["--color=always"]),
        (False, {"FORCE_COLOR": "1", "NO_COLOR": "1"}, []),
        (False, {"FORCE_COLOR": "1"}, ["--no-color"]),
    ]

    def watched(case: tuple[bool, dict[str, str], list[str]]) -> Any:
        return _cli(
            _env(asgi_server, asgi_server.token, **case[1]), "watch", str(mixed.id), *case[2]
        )

    with ThreadPoolExecutor(len(cases)) as pool:  # piped, all at once
        outs = list(pool.map(watched, cases))
    for (wanted, extra, flags), out in zip(cases, outs, strict=True):
        assert out.returncode == 0, out.stderr
        green, magenta = "\x1b[32mSUCCEEDED\x1b[0m", "\x1b[35mleader\x1b[0m"
        coloured = green in out.stdout and magenta in out.stdout
        assert coloured is wanted, (extra, flags, out.stdout)
        assert wanted or "\x1b" not in out.stdout, (extra, flags, out.stdout)
    code, shown = _cli_on_a_terminal(env, "watch", str(mixed.id))
    assert code == 0 and "\x1b[32mSUCCEEDED\x1b[0m" in shown, shown
    code, shown = _cli_on_a_terminal(env | {"NO_COLOR": "1"}, "watch", str(mixed.id))
    assert code == 0 and "SUCCEEDED" in shown and "\x1b" not in shown, shown

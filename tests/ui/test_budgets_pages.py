"""Budgets on the monitor and the run page (test client): used against the limit, the cue near
and at a limit, pending approvals on a run's row, and a bounded number of queries."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.template.loader import render_to_string
from django.test import Client

from frontend.selectors import runs
from loops.models import ActionApproval, ApprovalStatus, LoopRun, RunStatus
from loops.services.budgets import budget_take, run_budget_usage, run_limits
from loops.services.steps import step_record
from loops.services.transitions import Lease
from tests.support.factories import make_pattern, make_run
from tests.support.limits import running_run, snapshot

pytestmark = pytest.mark.django_db
ClientAs = Callable[[str], Client]

LIMITED = {"budgets": {"perRun": {"tokens": 10_000, "cost": 0.5, "invocations": 4}}}


def html(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return str(response.content.decode())


def row_of(page: str, run: LoopRun) -> str:
    return page.split(f'id="run-{run.id}"')[1].split("</tr>")[0]


def charge(lease: Lease, tokens: tuple[int, int] = (1_200, 271), cost: float = 0.0125) -> None:
    """A model step, recorded as the engine does: it charges the run's (and the day's) buckets."""
    step_record(
        lease,
        role="maker",
        invocation="maker:0",
        kind="model",
        name="m",
        request={"step": 1},
        response={"message": {"role": "assistant", "content": "x"}},
        tokens_in=tokens[0],
        tokens_out=tokens[1],
        cost=cost,
    )


def approval(run: LoopRun, seq: int, status: str = ApprovalStatus.PENDING) -> ActionApproval:
    return ActionApproval.objects.create(
        run=run,
        step_seq=seq,
        role="maker",
        invocation="maker:0",
        tool_name="write_file",
        arguments={"path": f"f{seq}.txt"},
        proposal_hash=f"{seq:064d}",
        status=status,
    )


def test_a_limited_run_shows_used_against_its_limits_on_the_monitor_and_its_page(
    client_as: ClientAs,
) -> None:
    run, lease = running_run(policy=LIMITED)
    charge(lease)
    client = client_as("viewer")

    row = row_of(html(client.get("/")), run)
    assert "1200 / 271" in row  # tokens in / out, as before
    assert "1,471 / 10,000" in row and "0.0125 / 0.50" in row
    assert row.count("<meter") == 2 and 'data-state="ok"' in row

    page = html(client.get(f"/runs/{run.id}"))
    budgets = page.split('id="run-budgets"')[1].split("</section>")[0]
    assert "This run" in budgets and "Pattern today" not in budgets  # no daily limit
    assert "1,471 / 10,000" in budgets and "0.0125 / 0.50" in budgets
    assert 'data-metric="invocations"' in budgets and "0 / 4" in budgets
    assert 'data-metric="toolCalls"' not in budgets  # unlimited metrics are not listed
    # The page and the API read the same figures.
    usage = run_budget_usage(run)["perRun"]
    assert usage["tokens"] == {"used": 1471, "limit": 10000}
    assert usage["cost"] == {"used": 0.0125, "limit": 0.5}


def test_budgets_near_and_at_their_limit_are_marked_and_daily_limits_are_listed(
    client_as: ClientAs,
) -> None:
    pattern = make_pattern(policy={"budgets": {"daily": {"tokens": 100_000}}})
    policy = {"budgets": {"perRun": {"tokens": 1_800, "cost": 0.01, "toolCalls": 2}}}
    run, lease = running_run(pattern, policy=policy)
    charge(lease)  # tokens 1,471 of 1,800 (82 %), cost 0.0125 of 0.01 (over: the call crossed)
    budget_take(run_limits(run.id), {"toolCalls": 2})  # tool calls 2 of 2
    client = client_as("viewer")

    row = row_of(html(client.get("/")), run)
    assert 'data-metric="tokens" data-state="near"' in row
    assert 'data-metric="cost" data-state="exhausted"' in row and "exhausted" in row

    page = html(client.get(f"/runs/{run.id}"))
    budgets = page.split('id="run-budgets"')[1].split("</section>")[0]
    per_run, daily = budgets.split('data-budget="daily"')
    assert '<tr data-metric="tokens" data-state="near">' in per_run
    assert '<tr data-metric="cost" data-state="exhausted">' in per_run
    assert '<tr data-metric="toolCalls" data-state="exhausted">' in per_run and "2 / 2" in per_run
    assert "Pattern today (UTC)" in daily and "1,471 / 100,000" in daily
    assert '<tr data-metric="tokens" data-state="ok">' in daily


def test_a_run_without_limits_shows_only_what_it_used(client_as: ClientAs) -> None:
    run, lease = running_run()
    charge(lease)
    client = client_as("viewer")
    row = row_of(html(client.get("/")), run)
    assert "1200 / 271" in row and "0.0125" in row
    assert "<meter" not in row and "10,000" not in row and "budget" not in row
    page = html(client.get(f"/runs/{run.id}"))
    assert 'id="run-budgets"' not in page and "Budgets" not in page
    assert "1200 / 271" in page  # the summary's tokens in / out


def test_a_blocked_run_keeps_its_budget_reason_and_shows_the_exhausted_budget(
    client_as: ClientAs,
) -> None:
    reason = "per-run budget toolCalls exhausted (2/2)"
    run = make_run(
        status=RunStatus.BLOCKED,
        failure_reason=reason,
        policy_snapshot=snapshot({"budgets": {"perRun": {"toolCalls": 2}}}),
    )
    budget_take(run_limits(run.id), {"toolCalls": 2})
    page = html(client_as("viewer").get(f"/runs/{run.id}"))
    assert reason in page
    assert '<tr data-metric="toolCalls" data-state="exhausted">' in page


def test_a_row_shows_how_many_approvals_of_its_run_are_pending(client_as: ClientAs) -> None:
    waiting = make_run(status=RunStatus.WAITING_APPROVAL)
    for seq in (1, 2):
        approval(waiting, seq)
    approval(waiting, 3, ApprovalStatus.APPROVED)
    decided = make_run()
    approval(decided, 1, ApprovalStatus.REJECTED)
    page = html(client_as("viewer").get("/"))
    row = row_of(page, waiting)
    assert "2 pending approvals" in row
    assert f'href="/runs/{waiting.id}#run-approvals"' in row
    assert "pending approval" not in row_of(page, decided)


def test_the_live_row_carries_the_budget_and_the_pending_approvals() -> None:
    run, lease = running_run(policy=LIMITED)
    charge(lease)
    approval(run, 1)
    [listed] = runs.runs_by_ids([run.id])  # what the monitor's stream renders
    row = render_to_string("frontend/runs/_row.html", {"run": listed})
    assert "1,471 / 10,000" in row and "0.0125 / 0.50" in row
    assert "1 pending approval<" in row


def _busy_runs(n: int) -> None:
    pattern = make_pattern(policy=LIMITED)
    for i in range(n):
        run, lease = running_run(pattern, owner=f"w{i}")
        charge(lease)
        approval(run, 1)
        make_run(pattern)  # and one without usage or a snapshot


def test_the_monitor_needs_the_same_few_queries_for_20_runs_as_for_2(
    client_as: ClientAs, django_assert_max_num_queries: Any
) -> None:
    client = client_as("viewer")
    _busy_runs(1)
    client.get("/")  # warm the session and the caches
    with django_assert_max_num_queries(12) as few:
        page = html(client.get("/"))
    assert page.count("1,471 / 10,000") == 1
    _busy_runs(9)
    with django_assert_max_num_queries(len(few.captured_queries)):
        page = html(client.get("/"))
    assert page.count("1,471 / 10,000") == 10 and page.count("1 pending approval<") == 10
    assert page.count('<tr id="run-') == 20

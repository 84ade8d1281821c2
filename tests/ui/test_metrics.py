"""The Metrics page and the patterns' next cron fire, rendered through the test client."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from frontend.selectors.metrics import _percentile, metrics_summary
from loops.models import ActionApproval, RunStatus
from tests.support.factories import make_pattern, make_run
from tests.support.usage import charge

pytestmark = pytest.mark.django_db
ClientAs = Callable[[str], Client]


def html(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return str(response.content.decode())


def _approval(run: Any, seq: int, waited: float | None) -> ActionApproval:
    approval = ActionApproval.objects.create(
        run=run, step_seq=seq, role="maker", invocation="maker-1", tool_name="write",
        arguments={"path": "a.txt"}, proposal_hash="x" * 64,
    )  # fmt: skip
    if waited is not None:
        ActionApproval.objects.filter(pk=approval.pk).update(
            status="approved",
            decided_by="ann",
            decided_at=approval.created_at + timedelta(seconds=waited),
            approved_hash="x" * 64,
        )
    return approval


def test_percentiles_are_nearest_rank() -> None:
    assert _percentile([], 0.5) is None
    assert _percentile([5.0], 0.9) == 5.0
    values = [float(n) for n in range(1, 11)]
    assert _percentile(values, 0.5) == 5.0
    assert _percentile(values, 0.9) == 9.0


def test_the_summary_counts_runs_waits_and_usage() -> None:
    pattern = make_pattern()
    done = make_run(pattern, status=RunStatus.SUCCEEDED)
    make_run(pattern, status=RunStatus.SUCCEEDED)
    parked = make_run(pattern, status=RunStatus.WAITING_APPROVAL)
    make_run(pattern, status=RunStatus.FAILED)
    for seq, waited in enumerate([30.0, 90.0, 600.0]):
        _approval(done, seq + 1, waited)
    _approval(parked, 1, None)  # still pending
    charge(done, invocations=2, tool_calls=3, tokens=100 + 20, cost=0.01)
    charge(done, tokens=50 + 5, cost=0.0025)

    metrics = metrics_summary(days=7)

    by_status = {row.status: row.count for row in metrics.runs_by_status}
    assert (by_status["succeeded"], by_status["waiting_approval"], by_status["failed"]) == (2, 1, 1)
    assert metrics.runs_total == 4
    waits = metrics.approvals
    assert (waits.decided, waits.median_seconds, waits.longest_seconds) == (3, 90.0, 600.0)
    assert waits.pending == 1 and waits.oldest_pending is not None
    [today] = metrics.usage
    assert (today.invocations, today.tool_calls) == (2, 3)
    assert (today.tokens, today.cost) == (175, Decimal("0.0125"))
    assert (metrics.tokens_total, metrics.cost_total) == (175, Decimal("0.0125"))
    assert (metrics.invocations_total, metrics.tool_calls_total) == (2, 3)


def test_the_metrics_page_shows_the_figures_to_any_role(client_as: ClientAs) -> None:
    run = make_run(status=RunStatus.SUCCEEDED)
    _approval(run, 1, 125.0)
    charge(run, invocations=1, tool_calls=4, tokens=1200 + 34, cost=0.5)
    page = html(client_as("viewer").get("/ui/metrics?days=30"))
    assert 'aria-current="page"' in page.split('href="/ui/metrics"')[1][:40]
    runs_table = page.split('id="runs-by-status"')[1].split("</table>")[0]
    assert "succeeded" in runs_table and '<td class="num">1</td>' in runs_table
    waits = page.split('id="approval-waits"')[1].split("</dl>")[0]
    assert "2m" in waits  # 125 s, compact
    usage = page.split('id="usage-per-day"')[1].split("</table>")[0]
    assert "Tokens (in + out)" in usage and "Tool calls" in usage and "Steps" not in usage
    assert '<td class="num">1,234</td>' in usage and "0.5000" in usage
    assert "selected>last 30 days" in page


def test_the_metrics_page_has_empty_states_and_ignores_a_bad_window(client_as: ClientAs) -> None:
    page = html(client_as("viewer").get("/ui/metrics?days=abc"))
    assert "No runs in this window." in page and "No usage in this window." in page
    assert "selected>last 14 days" in page


def test_the_patterns_pages_show_the_next_cron_fire(client_as: ClientAs) -> None:
    make_pattern(key="nightly", trigger_type="cron", cron_expression="0 3 * * *", timezone="UTC")
    make_pattern(key="by-hand")
    listing = html(client_as("viewer").get("/patterns"))
    nightly_row = listing.split('href="/patterns/nightly"')[1].split("</tr>")[0]
    tomorrow_or_today = timezone.now() + timedelta(days=1)
    assert "03:00:00 UTC" in nightly_row and "<time" in nightly_row
    assert str(tomorrow_or_today.year) in nightly_row
    manual_row = listing.split('href="/patterns/by-hand"')[1].split("</tr>")[0]
    assert "<time" not in manual_row
    detail = html(client_as("viewer").get("/patterns/nightly"))
    assert "next fire" in detail and "03:00:00 UTC" in detail

"""The reads an invocation's start and a verification make, as the engine gets them: on
PostgreSQL prepared statements (``orchestrator.sql.fetch_all_prepared``), on SQLite the ORM;
the same values either way (the suite runs on both)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.db import transaction

from loops.models import LoopArtifact, RunStatus
from loops.services import budget_rules, budgets
from loops.services.artifacts import run_artifacts
from loops.services.endings import run_transition
from loops.services.transitions import run_status_changes
from loops.worker.harness_bind import worked
from tests.support.limits import running_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_status_changes_come_in_order_with_aware_times() -> None:
    run, lease = running_run()
    run_transition(run_id=run.id, to=RunStatus.VERIFYING, actor=lease.owner, lease=lease)
    changes = run_status_changes(run.id)
    assert [status for status, _at in changes] == ["queued", "preparing", "running", "verifying"]
    times = [at for _status, at in changes]
    assert all(at.tzinfo is not None for at in times) and times == sorted(times)
    assert 0 <= worked(run.id) < 60  # running, then verifying: both working time
    with transaction.atomic():  # inside a transaction: the same rows, unprepared
        assert run_status_changes(run.id) == changes


def test_a_scope_s_usage_is_decimal_and_zero_for_a_bucket_not_made() -> None:
    run, _lease = running_run()
    scope = budget_rules.run_scope(run.id)
    budgets._add_many([(scope, "invocations", Decimal(2)), (scope, "tokens", Decimal(150))])
    assert budgets.usage(scope, ["invocations", "tokens", "toolCalls"]) == {
        "invocations": Decimal(2),
        "tokens": Decimal(150),
        "toolCalls": Decimal(0),
    }
    assert budgets.usage(scope, []) == {}


def test_a_run_s_artifacts_oldest_first() -> None:
    run, _lease = running_run()
    other, _ = running_run()
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for n, name in enumerate(["b.diff", "a.txt"]):
        LoopArtifact.objects.create(
            run_id=run.id, kind="file", name=name, created_at=start + dt.timedelta(seconds=n)
        )
    LoopArtifact.objects.create(run_id=other.id, kind="file", name="elsewhere")
    found = run_artifacts(run.id)
    assert [(a["kind"], a["name"]) for a in found] == [("file", "b.diff"), ("file", "a.txt")]
    ids = set(LoopArtifact.objects.filter(run_id=run.id).values_list("id", flat=True))
    assert {a["id"] for a in found} == ids

"""A fence (``id = … AND lease_owner = … AND lease_token = …``) is planned as a primary-key
lookup however many runs are leased, also as the generic plan of a prepared statement made
from statistics gathered while no run was leased (PostgreSQL). The reaper's expired-lease
scan can still use its partial index (``loops_run_leased``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction

from loops import db
from loops.models import LoopRun
from loops.services import budget_sql, step_sql
from loops.services.claims import Claimed, run_claim
from loops.services.transitions import fence_touch_sql
from tests.support.factories import make_pattern

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

RUNS, LEASED = 400, 300


@pytest.fixture(autouse=True)
def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("plans are PostgreSQL's")


@pytest.fixture
def leased() -> Iterator[Claimed]:
    """One of many leased runs, claimed after the table was analyzed with none leased."""
    pattern = make_pattern()
    bindings = {"leader": "leader", "makers": ["maker"], "verifier": "verifier"}
    LoopRun.objects.bulk_create(
        [LoopRun(pattern=pattern, goal="g", role_bindings=bindings) for _ in range(RUNS)]
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE loops_looprun")
    claims = run_claim(owner="w", lease_seconds=60, limit=LEASED)
    assert len(claims) == LEASED
    yield claims[len(claims) // 2]


def _generic_plan(sql: str, params: list[Any], *settings: str) -> dict[str, Any]:
    """The generic plan PostgreSQL keeps for ``sql`` once prepared (``%s`` placeholders), in
    one transaction (one server connection behind a transaction pooler too)."""
    numbered = db._numbered(sql)  # as a batch prepares it
    values = ", ".join(["%s"] * len(params))
    with transaction.atomic(), connection.cursor() as cursor:
        for setting in ("plan_cache_mode = force_generic_plan", *settings):
            cursor.execute(f"SET LOCAL {setting}")
        cursor.execute(f"PREPARE lw_test_fence AS {numbered}")
        cursor.execute(f"EXPLAIN (FORMAT JSON) EXECUTE lw_test_fence({values})", params)
        plan = cursor.fetchone()[0]
        cursor.execute("DEALLOCATE lw_test_fence")
    return (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]


def _indexes_on_runs(plan: dict[str, Any]) -> set[str]:
    found = set()
    if plan.get("Relation Name") == "loops_looprun" and "Index Name" in plan:
        found.add(plan["Index Name"])
    for child in plan.get("Plans", []):
        found |= _indexes_on_runs(child)
    return found


def test_the_fence_statements_look_the_run_up_by_its_primary_key(leased: Claimed) -> None:
    lease = leased.lease
    fence = (
        f"UPDATE loops_looprun r SET updated_at = now() WHERE {step_sql.FENCE}",
        step_sql.fence_params(lease),
    )
    for sql, params in (fence, fence_touch_sql(lease), budget_sql.fence_limits_sql(lease)):
        assert _indexes_on_runs(_generic_plan(sql, params)) == {"loops_looprun_pkey"}, sql


def test_the_reapers_scan_can_still_use_the_leased_index(leased: Claimed) -> None:
    sql = (
        "SELECT id FROM loops_looprun WHERE lease_owner IS NOT NULL "
        "AND lease_expires_at < now() ORDER BY lease_expires_at LIMIT %s"
    )
    plan = _generic_plan(sql, [10], "enable_seqscan = off")
    assert _indexes_on_runs(plan) == {"loops_run_leased"}

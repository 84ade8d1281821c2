"""The budgets' SQL text: the run's fence that reads its limits, and the usage upserts.

Statements only (a text and its parameters); ``budgets`` runs them, ``step_sql`` and
``step_fast`` send the fences in their batches. Usage buckets are always taken in one order
(per-run scope first, then the pattern's day, metrics sorted), so writers never deadlock.
"""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

from loops.services.budget_rules import RunLimits
from loops.services.transitions import Lease
from orchestrator import sql as vendor
from orchestrator import wakeups

Statement = tuple[str, list[Any]]

#: The columns ``budget_rules.limits_from_row`` needs, for a statement on ``loops_looprun`` (a
#: ``RETURNING`` list or a ``SELECT``): pattern id, pinned snapshot, the pattern's policy now.
LIMIT_COLUMNS = (
    "pattern_id, policy_snapshot, "
    "(SELECT p.policy FROM loops_looppattern p WHERE p.id = loops_looprun.pattern_id)"
)


def fence_limits_sql(
    lease: Lease,
    *,
    step_increment: int = 0,
    event_increment: int = 0,
    release_admission: bool = False,
    steps_before: int | None = None,
) -> Statement:
    """The statement of ``budgets.fenced_limits``, for a caller that sends it in a batch (its
    one row, or none when the lease is lost, goes to ``budgets.limits_from_fence``).
    ``steps_before`` also requires the run's step count to be that (a journal that numbered its
    steps itself)."""
    release = ", model_call_token = NULL" if release_admission else ""
    expected = "" if steps_before is None else " AND step_count = %s"
    touched = wakeups.touched_sql(vendor.now_sql(), lease.run_id)
    sql = (
        "UPDATE loops_looprun SET step_count = step_count + %s, "  # noqa: S608 (constants)
        f"event_seq = event_seq + %s, updated_at = {touched}"
        f"{release} "
        f"WHERE id = %s AND lease_owner = %s AND lease_token = %s{expected} "
        f"RETURNING step_count, event_seq, {LIMIT_COLUMNS}"
    )
    params = [step_increment, event_increment, vendor.uuid_param(lease.run_id), lease.owner]
    return sql, [*params, lease.token, *([] if steps_before is None else [steps_before])]


def fence_unchanged_sql(
    lease: Lease,
    limits: RunLimits,
    *,
    steps_before: int,
    step_increment: int,
    call_hash: str,
    occurrences_below: int,
) -> Statement:
    """The fence of :func:`fence_limits_sql` (PostgreSQL) that also requires what made a write
    plain when the caller last read the run: the run has exactly ``steps_before`` steps, its
    policy snapshot and its pattern's policy are the texts ``limits`` were read from (their
    MD5s), and fewer than ``occurrences_below`` earlier tool steps carry ``call_hash``. It
    returns the new step count, or no row when anything differs (or the lease is lost), and
    then changes nothing: statements guarded by that step count (``step_sql``) write nothing
    either, and the caller reads the run again."""
    assert limits.fingerprint is not None
    touched = wakeups.touched_sql(vendor.now_sql(), lease.run_id)
    sql = (
        "UPDATE loops_looprun SET step_count = step_count + %s, "  # noqa: S608 (constants)
        f"updated_at = {touched}, model_call_token = NULL "
        "WHERE id = %s AND lease_owner = %s AND lease_token = %s AND step_count = %s "
        "AND md5(COALESCE(policy_snapshot::text, '')) = %s "
        "AND md5(COALESCE((SELECT p.policy::text FROM loops_looppattern p "
        "WHERE p.id = loops_looprun.pattern_id), '')) = %s "
        "AND (SELECT COUNT(*) FROM loops_loopstep s WHERE s.run_id = loops_looprun.id "
        "AND s.call_hash = %s AND s.kind = 'tool') < %s "
        "RETURNING step_count"
    )
    params = [step_increment, lease.run_id, lease.owner, lease.token, steps_before]
    return sql, [*params, *limits.fingerprint, call_hash, occurrences_below]


def run_limits_sql(run_id: uuid.UUID) -> Statement:
    """The run's limit columns (:data:`LIMIT_COLUMNS`), read on their own."""
    sql = f"SELECT {LIMIT_COLUMNS} FROM loops_looprun WHERE id = %s"  # noqa: S608 (constants)
    return sql, [vendor.uuid_param(run_id)]


def number_param(value: Decimal) -> Any:
    """A number for raw SQL: SQLite compares a text parameter (how Decimal is sent) as greater
    than any number, so it gets an int or a float."""
    if vendor.is_postgres():
        return value
    return int(value) if value == value.to_integral_value() else float(value)


def upsert_sql(scope: str, metric: str, n: Decimal, limit: Decimal | None) -> Statement:
    """Add ``n`` to the bucket (created at ``n``), unless the sum would pass ``limit``.

    One ``INSERT … ON CONFLICT DO UPDATE … WHERE``: the database locks the existing row and
    judges the condition on its latest committed value, so parallel writers never overtake one
    another; its row count says whether it was applied.
    """
    guard = "" if limit is None else " WHERE loops_usagebucket.value + excluded.value <= %s"
    now = vendor.now_sql()
    sql = (
        "INSERT INTO loops_usagebucket (scope, metric, value, updated_at) "  # noqa: S608 (constants and placeholders only)
        f"VALUES (%s, %s, %s, {now}) ON CONFLICT (scope, metric) DO UPDATE SET "
        f"value = loops_usagebucket.value + excluded.value, updated_at = {now}{guard}"
    )
    limits = [] if limit is None else [number_param(limit)]
    return sql, [scope, metric, number_param(n), *limits]


def add_many_sql(rows: list[tuple[str, str, Decimal]]) -> Statement:
    """Add to several buckets whatever their limits, in one multi-row upsert (rows are taken
    in the given order, which must be the one order every writer uses)."""
    now = vendor.now_sql()
    values = ", ".join([f"(%s, %s, %s, {now})"] * len(rows))
    sql = (
        "INSERT INTO loops_usagebucket (scope, metric, value, updated_at) "  # noqa: S608 (constants and placeholders only)
        f"VALUES {values} ON CONFLICT (scope, metric) DO UPDATE SET "
        f"value = loops_usagebucket.value + excluded.value, updated_at = {now}"
    )
    return sql, [p for scope, metric, n in rows for p in (scope, metric, number_param(n))]

"""Vendor-specific SQL pieces shared by the apps' raw statements (PostgreSQL or SQLite).

Time is always the database's clock, never a worker's: a worker whose clock drifts cannot
extend or steal a lease (docs/reliability.md D5). Nothing here knows an app's models.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models.expressions import RawSQL


@functools.cache
def is_postgres() -> bool:
    """Every thread's connection is to the one configured database (looked up once: the
    connection proxy's per-thread lookup costs more than the statements it shapes)."""
    return connections[DEFAULT_DB_ALIAS].vendor == "postgresql"


def now_sql() -> str:
    """The database's current time (of the statement, not of the transaction's start), in the
    storage format Django uses for the vendor."""
    if is_postgres():
        return "clock_timestamp()"
    return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"


def now_plus_sql() -> str:
    """Database time plus a number of seconds given as one parameter (see ``seconds_param``)."""
    if is_postgres():
        return "(clock_timestamp() + make_interval(secs => %s))"
    return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"


def seconds_param(seconds: float) -> Any:
    return float(seconds) if is_postgres() else f"{float(seconds):+.3f} seconds"


def placeholders(values: Sequence[Any]) -> str:
    """``%s, %s, ...`` for an IN list (SQLite has no array parameters)."""
    return ", ".join(["%s"] * len(values))


def skip_locked() -> str:
    """Row locking for claim queries; SQLite serialises writers (IMMEDIATE) instead."""
    return " FOR UPDATE SKIP LOCKED" if is_postgres() else ""


def for_update() -> str:
    return " FOR UPDATE" if is_postgres() else ""


def uuid_param(value: Any) -> Any:
    """UUIDs are native on PostgreSQL and stored as 32-char hex text on SQLite."""
    return value if is_postgres() else value.hex


def fetch_all(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def execute(sql: str, params: Sequence[Any]) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def time_in(seconds: float) -> RawSQL:
    """``now + seconds`` on the database clock, for ``update()``."""
    return RawSQL(now_plus_sql(), [seconds_param(seconds)])  # noqa: S611 - constant SQL


def time_now() -> RawSQL:
    return RawSQL(now_sql(), [])  # noqa: S611 - constant SQL

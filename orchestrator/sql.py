"""Vendor-specific SQL pieces shared by the apps' raw statements (PostgreSQL or SQLite).

Time is always the database's clock, never a worker's: a worker whose clock drifts cannot
extend or steal a lease (docs/reliability.md D5). Nothing here knows an app's models.
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections
from django.db.models.expressions import RawSQL


@functools.cache
def is_postgres() -> bool:
    """Every thread's connection is to the one configured database (looked up once: the
    connection proxy's per-thread lookup costs more than the statements it shapes)."""
    return connections[DEFAULT_DB_ALIAS].vendor == "postgresql"


@functools.cache
def statements_unprepared() -> bool:
    """Behind a transaction pooler (``LOOPWRIGHT_DB_POOLER``), where each transaction may run on
    another server session: the fast paths send their statements unprepared (docs/operations.md).
    Read once, like :func:`is_postgres` (tests that change it clear the cache)."""
    return bool(getattr(settings, "DB_POOLER", ""))


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


#: PostgreSQL connections (the driver's) → the statements prepared on them; None: this
#: connection's session does not keep them (a transaction-pooling proxy), plain queries only.
_PREPARED: weakref.WeakKeyDictionary[Any, set[str] | None] = weakref.WeakKeyDictionary()
_PLACEHOLDER = re.compile(r"%s")
#: What an ``EXECUTE`` of a statement this connection prepared may meet: not prepared (26000),
#: prepared already (42P05), "cached plan must not change result type" (0A000).
_NOT_OURS = frozenset({"26000", "42P05", "0A000"})
_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def fetch_one_prepared(name: str, sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
    """``sql``'s first row, through :func:`fetch_all_prepared`'s statement ``name``."""
    rows = _fetch_prepared(name, sql, params, many=False)
    return rows[0] if rows else None


def fetch_all_prepared(name: str, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """``sql``'s rows. On PostgreSQL outside a transaction, through a statement each
    connection prepares once as ``name`` (its plan is reused: planning a read of many small
    joins can cost more than running it); elsewhere, and behind a transaction pooler
    (:func:`statements_unprepared`), a plain query. ``sql`` has ``%s``
    placeholders and no other ``%``."""
    return _fetch_prepared(name, sql, params, many=True)


def _fetch_prepared(
    name: str, sql: str, params: Sequence[Any], *, many: bool
) -> list[tuple[Any, ...]]:
    if not _NAME.fullmatch(name):
        raise ValueError(f"not a statement name: {name!r}")
    if not is_postgres() or connection.in_atomic_block or statements_unprepared():
        return _fetch(sql, params, many)
    connection.ensure_connection()
    raw = connection.connection
    names = _PREPARED.setdefault(raw, set())
    if names is None:
        return _fetch(sql, params, many)
    try:
        with connection.cursor() as cursor:
            if name not in names:
                numbered = iter(range(1, len(params) + 1))
                body = _PLACEHOLDER.sub(lambda _m: f"${next(numbered)}", sql)
                cursor.execute(f"PREPARE {name} AS {body}")
                names.add(name)
            cursor.execute(f"EXECUTE {name}({placeholders(params)})", params)
            rows = cursor.fetchall() if many else cursor.fetchmany(1)
    except DatabaseError as exc:
        if getattr(exc.__cause__, "sqlstate", None) not in _NOT_OURS:
            raise
        # Not prepared where it ran, prepared already (the session is not ours alone), or its
        # result's shape changed under it (a migration): plain queries on this connection.
        _PREPARED[raw] = None
        return _fetch(sql, params, many)
    return [tuple(row) for row in rows]


def _fetch(sql: str, params: Sequence[Any], many: bool) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall() if many else cursor.fetchmany(1)
    return [tuple(row) for row in rows]


def execute(sql: str, params: Sequence[Any]) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def usage_day_add(table: str, key_column: str, key: Any, day: str, tokens: int, cost: Any) -> None:
    """Add ``tokens`` and ``cost`` to the ``(key_column, day)`` row of a daily usage ``table``
    (columns ``tokens``, ``cost``; unique on the pair), made when missing: one atomic upsert on
    PostgreSQL and SQLite alike (both know ``ON CONFLICT ... DO UPDATE``). ``table`` and
    ``key_column`` are the caller's constants, never input."""
    execute(
        f"INSERT INTO {table} ({key_column}, day, tokens, cost) VALUES (%s, %s, %s, %s) "  # noqa: S608
        f"ON CONFLICT ({key_column}, day) DO UPDATE SET "
        f"tokens = {table}.tokens + excluded.tokens, cost = {table}.cost + excluded.cost",
        [key, day, tokens, cost],
    )


def time_in(seconds: float) -> RawSQL:
    """``now + seconds`` on the database clock, for ``update()``."""
    return RawSQL(now_plus_sql(), [seconds_param(seconds)])  # noqa: S611 - constant SQL


def time_now() -> RawSQL:
    return RawSQL(now_sql(), [])  # noqa: S611 - constant SQL

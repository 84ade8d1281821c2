"""Small vendor-specific SQL pieces for the hot paths (claims, leases, fenced writes).

All lease arithmetic uses the database clock, never a worker's: a worker whose clock drifts
cannot extend or steal a lease (docs/reliability.md D5).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models import F, Field, Model, Q, Value
from django.db.models.expressions import CombinedExpression, RawSQL
from django.db.models.sql import UpdateQuery
from psycopg.adapt import Transformer


@functools.cache
def is_postgres() -> bool:
    """Every thread's connection is to the one configured database (looked up once: the
    connection proxy's per-thread lookup costs more than the statements it would shape)."""
    return connections[DEFAULT_DB_ALIAS].vendor == "postgresql"


def now_sql() -> str:
    """The database's current time, in the storage format Django uses for the vendor."""
    if is_postgres():
        # Wall-clock time of the statement, not of the transaction's start.
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
    """``now + seconds`` on the database clock, for ``update()`` (a worker's clock may drift)."""
    return RawSQL(now_plus_sql(), [seconds_param(seconds)])  # noqa: S611 - constant SQL


def time_now() -> RawSQL:
    return RawSQL(now_sql(), [])  # noqa: S611 - constant SQL


# --- ORM-shaped statements for batches ----------------------------------------------------------


def update_sql(model: type[Model], values: dict[str, Any], **filters: Any) -> tuple[str, list[Any]]:
    """The ``UPDATE`` that ``model.objects.filter(**filters).update(**values)`` would send
    (values prepared by their fields, expressions compiled), to send in a :class:`Batch`."""
    query = UpdateQuery(model)
    query.add_update_values(values)
    query.add_q(Q(**filters))
    sql, params = query.get_compiler(DEFAULT_DB_ALIAS).as_sql()
    return sql, list(params)


def set_clause(model: type[Model], values: dict[str, Any]) -> tuple[str, list[Any]]:
    """``SET`` assignments for ``values`` the way Django's ``update()`` sends them, built
    without the ORM's compiler for what the engine writes (plain values, ``F(field) + n``,
    :class:`RawSQL`); anything else goes through the compiler (:func:`update_sql`)."""
    parts, params = [], []
    meta = model._meta
    for name, value in values.items():
        field = meta.get_field(name)
        assert isinstance(field, Field)
        column = connection.ops.quote_name(field.column)
        if isinstance(value, RawSQL):
            parts.append(f"{column} = {value.sql}")
            params.extend(value.params)
        elif _is_increment(value):
            parts.append(f"{column} = {column} + %s")
            params.append(value.rhs.value)
        elif hasattr(value, "resolve_expression"):
            raise NeedsCompiler(name)
        else:
            parts.append(f"{column} = %s")
            params.append(field.get_db_prep_save(value, connection))
    return ", ".join(parts), params


class NeedsCompiler(Exception):
    """A value :func:`set_clause` does not build (an ORM expression other than its own)."""


def _is_increment(value: Any) -> bool:
    return (
        isinstance(value, CombinedExpression)
        and value.connector == "+"
        and isinstance(value.lhs, F)
        and isinstance(value.rhs, Value)
        and isinstance(value.rhs.value, int)
    )


def prepared(model: type[Model], name: str, value: Any) -> Any:
    """``value`` as the field ``name`` of ``model`` sends it to the database."""
    field = model._meta.get_field(name)
    assert isinstance(field, Field)
    return field.get_db_prep_save(value, connection)


def batches_are_sent_together() -> bool:
    """Do :func:`batch`'s statements travel together (PostgreSQL, outside an atomic block)?"""
    return is_postgres() and not connection.in_atomic_block


# --- batches: one transaction, as few network round trips as possible ---------------------------


@dataclass
class Result:
    """What one statement of a :class:`Batch` returned; filled once the batch has synced."""

    rows: list[tuple[Any, ...]] = field(default_factory=list)
    rowcount: int = -1


class _Counters(threading.local):
    round_trips = 0


_counters = _Counters()


def round_trips() -> int:
    """Network round trips this thread's batches made so far (for tests and benchmarks)."""
    return _counters.round_trips


def _log(sql: str, started: float) -> None:
    """Record a statement the way Django's debug cursor does, so ``CaptureQueriesContext``
    (and the statement-count tests) see what a pipelined batch sent."""
    if connection.queries_logged:
        connection.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})


class Batch:
    """Statements of one transaction, executed as they are added (the SQLite way, also used
    inside an outer atomic block). :func:`batch` returns the pipelined kind on PostgreSQL."""

    def add(self, sql: str, params: Sequence[Any] = ()) -> Result:
        result = Result()
        with connection.cursor() as cursor:  # Django's cursor logs the statement itself
            cursor.execute(sql, params)
            if cursor.description is not None:
                result.rows = list(cursor.fetchall())
            # After the fetch: SQLite counts the rows of a RETURNING statement as they are read.
            result.rowcount = cursor.rowcount
        return result

    def sync(self) -> None:
        """Make every result added so far available (already the case here)."""


class _SentTogether(Batch):
    """PostgreSQL: the statements are queued and sent as one multi-statement query, between
    ``BEGIN`` and ``COMMIT``. :meth:`sync` sends what is queued so far: one round trip, for a
    caller that must read a result before deciding what to write next.

    Each statement is prepared once per connection (``PREPARE lw_<digest>``, sent with its
    first use) and executed by name, so the server plans it once instead of at every write:
    planning is a large part of what these short statements cost the server. The arguments of
    each ``EXECUTE`` are rendered as literals when the statement is added, by psycopg's own
    adapters (what its client-side binding cursor does); the query then goes out as it is, so
    psycopg does not re-parse the whole multi-statement text for placeholders at every write
    (it caches that only for short queries, and it was a seventh of a step's CPU)."""

    def __init__(self, raw: Any) -> None:
        self.cursor = psycopg.ClientCursor(raw)  # the simple protocol: many statements
        self.literal = Transformer.from_context(raw).as_literal
        self.prepared = _prepared_on(raw)
        self.preparing: set[str] = set()
        self.queued: list[tuple[bytes, Result | None]] = [(b"BEGIN", None)]
        self.started = time.monotonic()
        self.logged = connection.queries_logged  # read once: the proxy lookup is not free

    def add(self, sql: str, params: Sequence[Any] = ()) -> Result:
        result = Result()
        name = _statement_name(sql)
        if name not in self.prepared and name not in self.preparing:
            self.queued.append((f"PREPARE {name} AS {_numbered(sql)}".encode(), None))
            self.preparing.add(name)
        statement = b"EXECUTE " + name.encode()
        if params:
            literal = self.literal
            values = [b"NULL" if value is None else literal(value) for value in params]
            statement += b"(" + b", ".join(values) + b")"
        self.queued.append((statement, result))
        if self.logged:
            _log(sql, self.started)
        return result

    def sync(self) -> None:
        if not self.queued:
            return
        self.cursor.execute(b"; ".join(statement for statement, _ in self.queued))
        _counters.round_trips += 1
        self.prepared |= self.preparing
        self.preparing.clear()
        for position, (_, result) in enumerate(self.queued):
            if position:
                self.cursor.nextset()
            if result is not None:
                # The result's status, not ``description`` (which builds every column's object).
                pgresult = self.cursor.pgresult
                if pgresult is not None and pgresult.status == _TUPLES_OK:
                    result.rows = list(self.cursor.fetchall())
                result.rowcount = self.cursor.rowcount
        self.queued.clear()

    def commit(self) -> None:
        self.queued.append((b"COMMIT", None))
        self.sync()


_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK

#: The statements prepared on each PostgreSQL connection (by name), kept with the connection.
_PREPARED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def _prepared_on(raw: Any) -> set[str]:
    return _PREPARED.setdefault(raw, set())


@functools.lru_cache(maxsize=1024)
def _statement_name(sql: str) -> str:
    """The name a statement is prepared under (its SQL's digest; the engine's statements are a
    few hundred texts, so the digest is computed once per text)."""
    return "lw_" + hashlib.sha1(sql.encode(), usedforsecurity=False).hexdigest()[:24]


def _numbered(sql: str) -> str:
    """``sql`` with its ``%s`` placeholders as ``$1, $2…``, for PREPARE, and each ``%%`` as the
    ``%`` it stands for (the batch is sent as it is, with no client-side binding)."""
    count = 0

    def number(match: re.Match[str]) -> str:
        nonlocal count
        if match.group(0) == "%%":
            return "%"
        count += 1
        return f"${count}"

    return _PLACEHOLDER.sub(number, sql)


_PLACEHOLDER = re.compile(r"%%|%s")


def _resync_prepared(raw: Any) -> None:
    """After a failed batch: which of our statements the connection really has prepared (a
    statement after the one that failed never ran, its PREPARE included)."""
    prepared = _prepared_on(raw)
    prepared.clear()
    with contextlib.suppress(psycopg.Error):
        rows = raw.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'lw\\_%'")
        prepared.update(str(name) for (name,) in rows.fetchall())


@contextlib.contextmanager
def batch() -> Iterator[Batch]:
    """One transaction whose statements travel in as few round trips as possible.

    On PostgreSQL, outside any atomic block, ``BEGIN``, the statements and ``COMMIT`` are sent
    as one multi-statement query: a write with nothing to decide in the middle is one network
    round trip (plus one per :meth:`Batch.sync`). Results are readable after a sync or once the
    block has exited (committed). An exception in the block, or an error of any statement,
    rolls the whole transaction back. Elsewhere (SQLite, or inside an atomic block, as in
    tests) the same statements run one by one in ``transaction.atomic()``.

    Every statement runs on the connection Django manages; errors are Django's.
    """
    if not batches_are_sent_together():
        with transaction.atomic():
            yield Batch()
        return
    connection.ensure_connection()
    raw = connection.connection
    with connection.wrap_database_errors:
        try:
            sent = _SentTogether(raw)
            yield sent
            sent.commit()
        except BaseException:
            raw.rollback()  # autocommit connection: ROLLBACK only if a transaction is open
            if not raw.closed:
                _resync_prepared(raw)
            raise

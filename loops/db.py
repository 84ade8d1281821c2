"""The loops app's database access: batched writes and the switch between a write's paths.

A write with a fast path (batched statements, one round trip on PostgreSQL) chooses it in one
place, its store function: ``if fast_path_available(): try the fast path, except NotPlain`` then
the exact path (every limit judged, one statement after the other). :func:`exact_path_forced`
turns every fast path off (the tests' ``write_path`` fixture runs each write both ways).

The vendor helpers (``now_sql``, ``placeholders``…) live in :mod:`orchestrator.sql`, Django's
private ORM internals in :mod:`loops.orm_private`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models import Field, Model
from psycopg.adapt import Transformer

from loops.orm_private import log_query, queries_logged
from orchestrator import wakeups
from orchestrator.sql import is_postgres, statements_unprepared

# --- the choice between a write's paths ---------------------------------------------------------


class NotPlain(Exception):
    """A fast path met a case it does not handle (a limit to judge, a tool-loop verdict, an
    approved call, a value only the ORM's compiler builds): it wrote nothing (its transaction is
    rolled back) and the write's exact path runs instead."""


class _Switch:
    """Whether every write is held to its exact path (process-wide: the driver's database
    threads see what the test set)."""

    exact_forced = False


_switch = _Switch()


@contextlib.contextmanager
def exact_path_forced() -> Iterator[None]:
    """Within the block every write takes its exact path and batches run statement by
    statement (for tests that cover both paths of a write)."""
    before, _switch.exact_forced = _switch.exact_forced, True
    try:
        yield
    finally:
        _switch.exact_forced = before


def fast_path_available() -> bool:
    """May a write try its batched path before its exact one? (Always, unless forced off.)"""
    return not _switch.exact_forced


def batches_are_sent_together() -> bool:
    """Do :func:`batch`'s statements travel together (PostgreSQL, outside an atomic block,
    fast paths on)? The one-round-trip variants of a write need it."""
    return is_postgres() and not connection.in_atomic_block and not _switch.exact_forced


def json_value(value: Any) -> Any:
    """A JSON column's value as a raw statement read it (jsonb comes as its text), as
    ``JSONField`` gives it (NULL and JSON null: None)."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def prepared(model: type[Model], name: str, value: Any) -> Any:
    """``value`` as the field ``name`` of ``model`` sends it to the database."""
    field = model._meta.get_field(name)
    assert isinstance(field, Field)
    return field.get_db_prep_save(value, connections[DEFAULT_DB_ALIAS])


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
    first use) and executed by name, so the server plans it once. The arguments of each
    ``EXECUTE`` are rendered as literals when the statement is added, by psycopg's own adapters
    (as its client-side binding cursor does), and the query goes out as it is, with no
    client-side parse for placeholders (docs/performance.md)."""

    def __init__(self, raw: Any) -> None:
        self.cursor = psycopg.ClientCursor(raw)  # the simple protocol: many statements
        self.literal = Transformer.from_context(raw).as_literal
        self.prepared = _prepared_on(raw)
        self.preparing: set[str] = set()
        self.queued: list[tuple[bytes, Result | None]] = [(b"BEGIN", None)]
        self.started = time.monotonic()
        self.logged = queries_logged()  # read once: the proxy lookup is not free

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
            log_query(sql, self.started)
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


class _SentInline(_SentTogether):
    """:class:`_SentTogether` behind a transaction pooler (``LOOPWRIGHT_DB_POOLER``): the next
    batch may run on another server session, which never saw this one's ``PREPARE``. Each
    statement goes out with its arguments rendered in place as literals (by the same adapters,
    as Django's client-side binding cursor sends every other query); still one round trip."""

    def add(self, sql: str, params: Sequence[Any] = ()) -> Result:
        result = Result()
        pieces = _pieces(sql)
        if len(pieces) != len(params) + 1:
            raise TypeError(f"{len(pieces) - 1} placeholders, {len(params)} arguments: {sql!r}")
        statement = [pieces[0]]
        literal = self.literal
        for value, piece in zip(params, pieces[1:], strict=True):
            statement.append(b"NULL" if value is None else literal(value))
            statement.append(piece)
        self.queued.append((b"".join(statement), result))
        if self.logged:
            log_query(sql, self.started)
        return result


_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK
#: "cached plan must not change result type": a statement prepared before a migration.
_RESULT_CHANGED = "0A000"

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


@functools.lru_cache(maxsize=1024)
def _pieces(sql: str) -> tuple[bytes, ...]:
    """``sql`` split at its ``%s`` placeholders, each ``%%`` as the ``%`` it stands for (for
    :class:`_SentInline`, which puts the arguments' literals between the pieces)."""
    pieces: list[str] = []
    piece: list[str] = []
    position = 0
    for match in _PLACEHOLDER.finditer(sql):
        piece.append(sql[position : match.start()])
        position = match.end()
        if match.group(0) == "%%":
            piece.append("%")
        else:
            pieces.append("".join(piece))
            piece = []
    piece.append(sql[position:])
    pieces.append("".join(piece))
    return tuple(text.encode() for text in pieces)


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

    Behind a transaction pooler (``LOOPWRIGHT_DB_POOLER``) the statements go unprepared, with
    their arguments in place (:class:`_SentInline`). Every statement runs on the connection
    Django manages; errors are Django's.
    """
    if not batches_are_sent_together():
        with transaction.atomic():
            yield Batch()
        return
    wrapper = connections[DEFAULT_DB_ALIAS]  # this thread's, looked up once
    wrapper.ensure_connection()
    raw = wrapper.connection
    unprepared = statements_unprepared()
    with wrapper.wrap_database_errors:
        try:
            sent = _SentInline(raw) if unprepared else _SentTogether(raw)
            with wakeups.collected():  # the runs it touched, announced once it committed
                yield sent
                sent.commit()
        except BaseException as exc:
            raw.rollback()  # autocommit connection: ROLLBACK only if a transaction is open
            if not raw.closed and not unprepared:
                if getattr(exc, "sqlstate", None) == _RESULT_CHANGED:
                    # A migration changed what a prepared statement returns: every statement
                    # of this session is prepared again at its next use (this write failed).
                    with contextlib.suppress(psycopg.Error):
                        raw.execute("DEALLOCATE ALL")
                _resync_prepared(raw)
            raise

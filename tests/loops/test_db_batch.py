"""``loops.db.batch()``: the statements of one transaction, sent together on PostgreSQL.

On PostgreSQL the arguments are rendered as literals by psycopg's adapters and the whole batch
goes out as one multi-statement query; these tests pin what that must preserve: values of every
kind the engine writes come back as they went in, a ``%`` in a statement stays a ``%``, a failing
statement rolls back the whole batch, and a batch costs one round trip per sync. On SQLite the
same calls run one statement at a time in ``transaction.atomic`` and must give the same results.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator

import pytest
from django.db import IntegrityError, NotSupportedError, connection

from loops import db
from orchestrator.sql import fetch_all, statements_unprepared

pytestmark = pytest.mark.django_db(transaction=True)
TABLE = "lw_batch_probe"


@pytest.fixture
def probe_table() -> Iterator[None]:
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {TABLE} (id INTEGER PRIMARY KEY, note TEXT, at TEXT)")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE {TABLE}")


def _notes() -> list[tuple[int, str | None]]:
    return [(int(i), n) for i, n in fetch_all(f"SELECT id, note FROM {TABLE} ORDER BY id", [])]


def test_values_come_back_as_they_were_sent(probe_table: None) -> None:
    awkward = "it's a \\ back'slash; -- not a comment %s %% $1 \u00e9\u4e2d"
    stamp = dt.datetime(2026, 12, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)
    with db.batch() as batch:
        batch.add(f"INSERT INTO {TABLE} (id, note) VALUES (%s, %s)", [1, awkward])
        batch.add(f"INSERT INTO {TABLE} (id, note) VALUES (%s, %s)", [2, None])
        batch.add(f"INSERT INTO {TABLE} (id, note, at) VALUES (%s, %s, %s)", [3, "t", str(stamp)])
        echoed = batch.add(
            "SELECT %s, CAST(%s AS INTEGER), %s", [awkward, 7, json.dumps({"k": ["v", 1]})]
        )
    assert _notes() == [(1, awkward), (2, None), (3, "t")]
    assert echoed.rows == [(awkward, 7, '{"k": ["v", 1]}')]


def test_a_percent_in_a_statement_stays_a_percent(probe_table: None) -> None:
    with db.batch() as batch:
        batch.add(f"INSERT INTO {TABLE} (id, note) VALUES (%s, '100%%')", [1])
        like = batch.add(f"SELECT id FROM {TABLE} WHERE note LIKE %s", ["100%%"])
        no_params = batch.add("SELECT '50%%'")
    assert _notes() == [(1, "100%")]
    assert like.rows == [(1,)]
    assert no_params.rows == [("50%",)]


def test_a_failing_statement_rolls_the_whole_batch_back(probe_table: None) -> None:
    with db.batch() as batch:
        batch.add(f"INSERT INTO {TABLE} (id, note) VALUES (%s, %s)", [1, "kept"])
    with pytest.raises(IntegrityError), db.batch() as batch:
        batch.add(f"INSERT INTO {TABLE} (id, note) VALUES (%s, %s)", [2, "rolled back"])
        batch.add(f"INSERT INTO {TABLE} (id, note) VALUES (%s, %s)", [1, "duplicate key"])
    assert _notes() == [(1, "kept")]
    # The connection is usable after the failure, prepared statements included.
    with db.batch() as batch:
        batch.add(f"INSERT INTO {TABLE} (id, note) VALUES (%s, %s)", [2, "after"])
    assert _notes() == [(1, "kept"), (2, "after")]


def test_results_are_readable_after_a_sync_inside_the_batch(probe_table: None) -> None:
    run_id = uuid.uuid4()
    with db.batch() as batch:
        first = batch.add("SELECT %s", [str(run_id)])
        batch.sync()
        assert first.rows == [(str(run_id),)]
        batch.add(f"INSERT INTO {TABLE} (id, note) VALUES (%s, %s)", [1, first.rows[0][0]])
    assert _notes() == [(1, str(run_id))]


def test_a_batch_is_one_round_trip_per_sync_on_postgresql(probe_table: None) -> None:
    if not db.batches_are_sent_together():
        assert connection.vendor == "sqlite"  # statement by statement: nothing to count
        return
    before = db.round_trips()
    with db.batch() as batch:
        for n in range(5):
            batch.add(f"INSERT INTO {TABLE} (id, note) VALUES (%s, %s)", [n, f"n{n}"])
    assert db.round_trips() - before == 1
    with db.batch() as batch:
        batch.add("SELECT 1")
        batch.sync()
        batch.add(f"INSERT INTO {TABLE} (id, note) VALUES (%s, %s)", [9, "n9"])
    assert db.round_trips() - before == 3
    assert len(_notes()) == 6


def test_a_migration_under_a_prepared_statement_fails_one_write_not_the_connection(
    probe_table: None,
) -> None:
    """A rolling upgrade's old worker: a column its prepared statement returns changed type.
    That write fails (nothing of it is kept); the connection's next batch prepares again."""
    if not db.batches_are_sent_together() or statements_unprepared():
        pytest.skip("prepared statements in batches are PostgreSQL's, without a pooler")
    read = f"SELECT id, at FROM {TABLE} WHERE id = %s"
    with db.batch() as batch:
        batch.add(f"INSERT INTO {TABLE} (id, note, at) VALUES (%s, %s, %s)", [1, "a", "7"])
        batch.add(read, [1])
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {TABLE} ALTER COLUMN at TYPE INTEGER USING at::integer")
    with pytest.raises(NotSupportedError), db.batch() as batch:
        batch.add(f"INSERT INTO {TABLE} (id, note) VALUES (%s, %s)", [2, "lost"])
        batch.add(read, [1])
    with db.batch() as batch:
        batch.add(f"INSERT INTO {TABLE} (id, note) VALUES (%s, %s)", [3, "kept"])
        again = batch.add(read, [1])
    assert again.rows == [(1, 7)]
    assert _notes() == [(1, "a"), (3, "kept")]

"""``orchestrator.sql.fetch_one_prepared`` and ``fetch_all_prepared``: on PostgreSQL a statement each connection prepares
once and then executes; in a transaction, on SQLite, or where the session does not keep its
statements (a transaction-pooling proxy), the same rows from a plain query."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from orchestrator import sql

SQL = "SELECT %s || '-' || %s"


def _prepared_here() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements")
        return {row[0] for row in cursor.fetchall()}


@pytest.mark.django_db(transaction=True)
def test_the_row_is_the_plain_query_s_everywhere() -> None:
    assert sql.fetch_one_prepared("lw_test_join", SQL, ["a", "b"]) == ("a-b",)
    assert sql.fetch_one_prepared("lw_test_join", SQL, ["c", "d"]) == ("c-d",)
    with transaction.atomic():
        assert sql.fetch_one_prepared("lw_test_join", SQL, ["e", "f"]) == ("e-f",)
    assert sql.fetch_one_prepared("lw_test_none", "SELECT 1 WHERE %s = 'x'", ["y"]) is None


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_postgres_prepares_once_per_connection_and_survives_losing_it() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's; SQLite caches its own")
    if sql.statements_unprepared():
        pytest.skip("behind a transaction pooler nothing is prepared (test_operations_pooler)")
    connection.close()
    assert sql.fetch_one_prepared("lw_test_join", SQL, ["a", "b"]) == ("a-b",)
    assert "lw_test_join" in _prepared_here()
    with transaction.atomic():  # a failed EXECUTE would break the transaction: plain here
        assert sql.fetch_one_prepared("lw_test_join", SQL, ["x", "y"]) == ("x-y",)
    # Another client of the same session (a pooling proxy, DISCARD ALL) dropped it: the row
    # still comes, from a plain query, and this connection stops preparing.
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    assert sql.fetch_one_prepared("lw_test_join", SQL, ["c", "d"]) == ("c-d",)
    assert sql.fetch_one_prepared("lw_test_join", SQL, ["e", "f"]) == ("e-f",)
    assert "lw_test_join" not in _prepared_here()
    # A new connection prepares again.
    connection.close()
    assert sql.fetch_one_prepared("lw_test_join", SQL, ["g", "h"]) == ("g-h",)
    assert "lw_test_join" in _prepared_here()


ROWS = (
    "SELECT n FROM (SELECT 1 AS n UNION ALL SELECT 2 UNION ALL SELECT 3) AS t "
    "WHERE n >= %s ORDER BY n"
)


@pytest.mark.django_db(transaction=True)
def test_every_row_comes_prepared_or_plain() -> None:
    assert sql.fetch_all_prepared("lw_test_rows", ROWS, [2]) == [(2,), (3,)]
    assert sql.fetch_all_prepared("lw_test_rows", ROWS, [1]) == [(1,), (2,), (3,)]
    assert sql.fetch_all_prepared("lw_test_rows", ROWS, [4]) == []
    with transaction.atomic():
        assert sql.fetch_all_prepared("lw_test_rows", ROWS, [3]) == [(3,)]
    if connection.vendor == "postgresql" and not sql.statements_unprepared():
        assert "lw_test_rows" in _prepared_here()
    # The first row of the same statement, as fetch_one_prepared reads it.
    assert sql.fetch_one_prepared("lw_test_rows", ROWS, [2]) == (2,)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_statement_whose_result_changed_type_under_it_reads_plainly() -> None:
    """A migration that changes a column a prepared read returns (a rolling upgrade's old
    worker still holds the statement): the next read comes from a plain query."""
    if connection.vendor != "postgresql" or sql.statements_unprepared():
        pytest.skip("a prepared statement's cached plan is PostgreSQL's")
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE lw_test_shape (v integer)")
        cursor.execute("INSERT INTO lw_test_shape VALUES (1)")
    try:
        read = "SELECT v FROM lw_test_shape WHERE %s::int IS NOT NULL"
        assert sql.fetch_all_prepared("lw_test_shape_read", read, [0]) == [(1,)]
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE lw_test_shape ALTER COLUMN v TYPE text")
        assert sql.fetch_all_prepared("lw_test_shape_read", read, [0]) == [("1",)]
        assert sql.fetch_all_prepared("lw_test_shape_read", read, [0]) == [("1",)]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE lw_test_shape")
        connection.close()  # the next test's connection prepares again


def test_statement_names_are_plain_identifiers() -> None:
    with pytest.raises(ValueError, match="not a statement name"):
        sql.fetch_one_prepared("x; DROP TABLE y", SQL, ["a", "b"])
    with pytest.raises(ValueError, match="not a statement name"):
        sql.fetch_all_prepared("Upper", SQL, ["a", "b"])

"""``LOOPWRIGHT_DB_POOLER=transaction`` (docs/operations.md, "PgBouncer"): behind a
transaction-pooling proxy every statement goes out unprepared, with the same results as the
prepared fast paths; the settings that follow from it; the live streams' listener.

``scripts/pgbouncer-suite.sh`` runs these (and the engine and end-to-end tests) through a real
PgBouncer; here the setting is also forced on a direct connection, where what the server keeps
prepared can be seen."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from psycopg.types.json import Jsonb

from loops import db
from orchestrator import sql, wakeups

ROOT = Path(__file__).resolve().parent.parent

#: Statements with every kind of argument a fast path sends: ``%%``, NULL, negative numbers,
#: UUIDs, JSON, arrays, times, quotes.
STATEMENTS: list[tuple[str, list[Any]]] = [
    ("SELECT %s::int + %s, 'a%%b' LIKE %s", [-3, 5, "a%"]),
    ("SELECT %s::uuid, %s::text IS NULL", [uuid.UUID(int=7), None]),
    ("SELECT %s::jsonb ->> 'k', %s::text", [Jsonb({"k": "it's"}), "x'; --"]),
    ("SELECT cardinality(%s::text[]), %s::float8 * 2", [["a", "b"], -1.25]),
    ("SELECT %s::timestamptz", [dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)]),
    ("SELECT 1 WHERE %s", [False]),
]


@pytest.fixture
def pooler() -> Iterator[None]:
    with override_settings(DB_POOLER="transaction"):
        sql.statements_unprepared.cache_clear()
        try:
            yield
        finally:
            sql.statements_unprepared.cache_clear()
    sql.statements_unprepared.cache_clear()


def _run_batch() -> list[tuple[list[tuple[Any, ...]], int]]:
    with db.batch() as statements:
        results = [statements.add(text, params) for text, params in STATEMENTS]
    return [(result.rows, result.rowcount) for result in results]


def _prepared_here() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements")
        return {row[0] for row in cursor.fetchall()}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_unprepared_batch_returns_what_the_prepared_one_does(pooler: None) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the batches are sent together on PostgreSQL only")
    connection.close()
    unprepared = _run_batch()
    assert not {name for name in _prepared_here() if name.startswith("lw_")}
    assert unprepared[0][0] == [(2, True)]
    assert unprepared[2][0] == [("it's", "x'; --")]
    assert unprepared[5] == ([], 0)
    with override_settings(DB_POOLER=""):
        sql.statements_unprepared.cache_clear()
        if sql.statements_unprepared():  # a run through PgBouncer: nothing to compare with
            return
        assert _run_batch() == unprepared


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_failed_unprepared_batch_rolls_back_and_the_next_one_runs(pooler: None) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the batches are sent together on PostgreSQL only")
    with pytest.raises(Exception, match="division by zero"), db.batch() as statements:
        statements.add("SELECT 1 / %s", [0])
    assert _run_batch()[0][0] == [(2, True)]


def test_the_argument_count_is_checked(pooler: None) -> None:
    with pytest.raises(TypeError, match="2 placeholders, 1 arguments"):
        db._SentInline.add(object.__new__(db._SentInline), "SELECT %s, %s", [1])


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_fetch_one_prepared_prepares_nothing(pooler: None) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    connection.close()
    assert sql.fetch_one_prepared("lw_test_pooled", "SELECT %s || %s", ["a", "b"]) == ("ab",)
    assert "lw_test_pooled" not in _prepared_here()


def test_the_listener_needs_a_direct_url_behind_a_pooler(pooler: None) -> None:
    assert wakeups._listener_params() is None
    url = "postgres://postgres@127.0.0.1:5432/loopwright"
    with override_settings(LISTEN_DATABASE_URL=url):
        assert wakeups._listener_params() == {"conninfo": url, "connect_timeout": 5}


def _settings(**env: str) -> dict[str, Any]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWRIGHT_DB_")}
    environment |= {"DJANGO_SETTINGS_MODULE": "orchestrator.settings", **env}
    script = (
        "import django, json; django.setup()\n"
        "from django.conf import settings\n"
        "d = settings.DATABASES['default']\n"
        "print(json.dumps([d.get('OPTIONS', {}), d.get('DISABLE_SERVER_SIDE_CURSORS', False)]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=environment, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    if done.returncode:
        return {"error": done.stderr}
    options, no_server_cursors = json.loads(done.stdout.strip().splitlines()[-1])
    return {"options": options, "no_server_cursors": no_server_cursors}


def test_the_setting_turns_off_what_outlives_a_transaction() -> None:
    url = "postgres://postgres@127.0.0.1:6432/loopwright"
    direct = _settings(DATABASE_URL=url)
    assert direct == {
        "options": {
            "connect_timeout": 5,
            "options": "-c idle_in_transaction_session_timeout=30000",
        },
        "no_server_cursors": False,
    }
    pooled = _settings(DATABASE_URL=url, LOOPWRIGHT_DB_POOLER="transaction")
    assert pooled == {
        "options": {"connect_timeout": 5, "prepare_threshold": None},
        "no_server_cursors": True,
    }
    assert (
        "LOOPWRIGHT_DB_POOLER"
        in _settings(DATABASE_URL=url, LOOPWRIGHT_DB_POOLER="session")["error"]
    )

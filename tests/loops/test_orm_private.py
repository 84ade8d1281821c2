"""The private Django APIs ``loops.orm_private`` relies on, checked against the installed
Django: after an upgrade a failure here names the API that changed and the version."""

from __future__ import annotations

import uuid

import django
import pytest
from django.db import connection
from django.db.models import F, Value
from django.db.models.expressions import CombinedExpression
from django.db.models.sql import UpdateQuery
from django.test.utils import CaptureQueriesContext

from loops import orm_private
from loops.models import LoopRun
from tests.support.factories import make_run


def _relied_on(holds: bool, api: str) -> None:
    if not holds:
        pytest.fail(
            f"Django {django.get_version()} changed {api}, which loops/orm_private.py relies on: "
            "adapt orm_private (and this test) to the new Django before upgrading.",
            pytrace=False,
        )


def test_update_query_has_the_methods_used() -> None:
    for name in ("add_update_values", "add_q", "get_compiler"):
        _relied_on(callable(getattr(UpdateQuery, name, None)), f"UpdateQuery.{name}")


def test_combined_expression_exposes_its_sides() -> None:
    increment = F("event_seq") + 1
    _relied_on(isinstance(increment, CombinedExpression), "F(...) + n as a CombinedExpression")
    for name in ("lhs", "connector", "rhs"):
        _relied_on(hasattr(increment, name), f"CombinedExpression.{name}")
    _relied_on(orm_private.is_increment(increment), "CombinedExpression(F, '+', Value(int))")
    _relied_on(not orm_private.is_increment(F("event_seq") * Value(2)), "CombinedExpression")


@pytest.mark.django_db
def test_update_sql_is_the_update_the_orm_sends() -> None:
    run = make_run()
    values = {"goal": "changed", "event_seq": F("event_seq") + 1}
    with CaptureQueriesContext(connection) as sent:
        LoopRun.objects.filter(pk=run.pk).update(**values)
    built, params = orm_private.update_sql(LoopRun, values, pk=run.pk)
    with CaptureQueriesContext(connection) as ours, connection.cursor() as cursor:
        cursor.execute(built, params)
    same = ours[-1]["sql"] == sent[-1]["sql"]
    _relied_on(same, "UpdateQuery(...).get_compiler(alias).as_sql() output")


@pytest.mark.django_db
def test_set_clause_writes_what_update_writes() -> None:
    run, twin = make_run(), make_run()
    token = uuid.uuid4().hex
    values = {"goal": token, "event_seq": F("event_seq") + 2, "cursor": {"phase": token}}
    LoopRun.objects.filter(pk=twin.pk).update(**values)
    assignments, params = orm_private.set_clause(LoopRun, values)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE loops_looprun SET {assignments} WHERE id = %s",
            [*params, run.pk.hex if connection.vendor == "sqlite" else run.pk],
        )
    columns = ("goal", "event_seq", "cursor")
    mine = LoopRun.objects.values_list(*columns).get(pk=run.pk)
    theirs = LoopRun.objects.values_list(*columns).get(pk=twin.pk)
    _relied_on(mine == theirs, "Field.get_db_prep_save / connection.ops.quote_name for SET")


@pytest.mark.django_db
def test_a_logged_statement_is_seen_by_capture_queries() -> None:
    _relied_on(hasattr(connection, "queries_log"), "connection.queries_log")
    _relied_on(hasattr(connection, "queries_logged"), "connection.queries_logged")
    with CaptureQueriesContext(connection) as sent:
        _relied_on(orm_private.queries_logged(), "connection.queries_logged under capture")
        orm_private.log_query("SELECT 'logged'", 0.0)
    _relied_on(
        [q["sql"] for q in sent.captured_queries] == ["SELECT 'logged'"],
        "connection.queries_log as CaptureQueriesContext reads it",
    )

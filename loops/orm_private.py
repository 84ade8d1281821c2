"""Every use of Django's private ORM internals, in one place.

What is used, and what it is relied on to do (tests/loops/test_orm_private.py checks each one
against the installed Django and names it when an upgrade changes it):

* ``django.db.models.sql.UpdateQuery`` with ``add_update_values``, ``add_q`` and
  ``get_compiler(alias).as_sql()``: the ``UPDATE`` that ``QuerySet.update()`` sends.
* ``CombinedExpression`` with ``lhs``, ``connector`` and ``rhs``: ``F(field) + n`` recognised as
  an increment.
* ``connection.queries_logged`` and ``connection.queries_log``: statements sent outside Django's
  cursor recorded the way its debug cursor records them (``CaptureQueriesContext`` reads them).
"""

from __future__ import annotations

import time
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import F, Field, Model, Q, Value
from django.db.models.expressions import CombinedExpression, RawSQL
from django.db.models.sql import UpdateQuery


def update_sql(model: type[Model], values: dict[str, Any], **filters: Any) -> tuple[str, list[Any]]:
    """The ``UPDATE`` that ``model.objects.filter(**filters).update(**values)`` would send
    (values prepared by their fields, expressions compiled)."""
    query = UpdateQuery(model)
    query.add_update_values(values)
    query.add_q(Q(**filters))
    sql, params = query.get_compiler(DEFAULT_DB_ALIAS).as_sql()
    return sql, list(params)


class NeedsCompiler(Exception):
    """A value :func:`set_clause` does not build (an ORM expression other than its own)."""


def set_clause(model: type[Model], values: dict[str, Any]) -> tuple[str, list[Any]]:
    """``SET`` assignments for ``values`` the way Django's ``update()`` sends them, for plain
    values, ``F(field) + n`` and :class:`RawSQL`; anything else raises :class:`NeedsCompiler`
    (the caller then uses :func:`update_sql`)."""
    parts, params = [], []
    meta = model._meta
    wrapper = connections[DEFAULT_DB_ALIAS]  # this thread's, looked up once (not per value)
    quote = wrapper.ops.quote_name
    for name, value in values.items():
        field = meta.get_field(name)
        assert isinstance(field, Field)
        column = quote(field.column)
        if isinstance(value, RawSQL):
            parts.append(f"{column} = {value.sql}")
            params.extend(value.params)
        elif is_increment(value):
            parts.append(f"{column} = {column} + %s")
            params.append(value.rhs.value)
        elif hasattr(value, "resolve_expression"):
            raise NeedsCompiler(name)
        else:
            parts.append(f"{column} = %s")
            params.append(field.get_db_prep_save(value, wrapper))
    return ", ".join(parts), params


def is_increment(value: Any) -> bool:
    """``F(field) + n`` with ``n`` an int."""
    return (
        isinstance(value, CombinedExpression)
        and value.connector == "+"
        and isinstance(value.lhs, F)
        and isinstance(value.rhs, Value)
        and isinstance(value.rhs.value, int)
    )


def queries_logged() -> bool:
    """Does the connection record statements (``DEBUG``, or a ``CaptureQueriesContext``)?"""
    return bool(connection.queries_logged)


def log_query(sql: str, started: float) -> None:
    """Record a statement sent outside Django's cursor as its debug cursor records one."""
    if connection.queries_logged:
        connection.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})

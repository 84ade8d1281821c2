"""The test command's second phase (PostgreSQL + Redis) runs only what the servers can change.

``make test`` runs the whole suite on the embedded SQLite default first, then again on
PostgreSQL + Redis. A test that touches neither a database nor Redis (pure functions, the
sandbox, the runtime) gives the same answer both times, so with
``LOOPWRIGHT_TEST_PHASE=services`` (set by scripts/test.sh for the second phase only) it is
deselected there. What counts as touching the servers: a ``django_db`` mark, a fixture that
reaches the database (``db``, ``transactional_db``, ``live_server``, ...), the ``postgres`` or
``e2e`` mark, or a module that names Redis.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

PHASE_VARIABLE = "LOOPWRIGHT_TEST_PHASE"
DATABASE_FIXTURES = frozenset(
    {
        "db",
        "transactional_db",
        "django_db_reset_sequences",
        "django_db_serialized_rollback",
        "live_server",
        "django_db_setup",
    }
)
SERVICE_MARKS = ("django_db", "postgres", "e2e")


@functools.cache
def _names_redis(path: Path) -> bool:
    try:
        return "redis" in path.read_text(encoding="utf-8").lower()
    except OSError:
        return True


def touches_services(item: pytest.Item) -> bool:
    """Whether ``item`` may answer differently on PostgreSQL + Redis than on SQLite."""
    if any(item.get_closest_marker(mark) for mark in SERVICE_MARKS):
        return True
    if DATABASE_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    return _names_redis(Path(str(item.path)))


def deselect_server_agnostic(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In the services phase, drop the tests the SQLite phase already answered for good."""
    if os.environ.get(PHASE_VARIABLE) != "services":
        return
    kept = [item for item in items if touches_services(item)]
    dropped = [item for item in items if not touches_services(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept

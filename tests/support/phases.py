"""The test command's second phase (PostgreSQL + Redis) runs only what the servers can change.

``make test`` runs the whole suite on the embedded SQLite default first, then again on
PostgreSQL + Redis. A test that touches neither a database nor Redis (pure functions, the
sandbox, the runtime) gives the same answer both times, so with
``LOOPWRIGHT_TEST_PHASE=services`` (set by scripts/test.sh for the second phase only) it is
deselected there. What counts as touching the servers: a ``django_db`` mark, a fixture that
reaches the database (``db``, ``transactional_db``, ``live_server``, ...), the ``postgres`` or
``e2e`` mark, or a module that names Redis.

A test marked ``one_backend`` answers for something no database backend changes (the sandbox,
skills, connectors, the route permissions, the UI) though it stores its runs on one: it runs
once, in the services phase when one follows (``LOOPWRIGHT_TEST_PHASE=embedded``, set by
scripts/test.sh for the SQLite phase when PostgreSQL and Redis answer), else on SQLite. What
each backend does differently (claims, leases, step writes, locks) keeps its tests in both.
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
SERVICE_MARKS = ("django_db", "postgres", "e2e", "one_backend")
ONE_BACKEND = "one_backend"


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


def _runs_here(item: pytest.Item, phase: str | None) -> bool:
    if phase == "services":
        return touches_services(item)
    if phase == "embedded":
        return item.get_closest_marker(ONE_BACKEND) is None
    return True


def deselect_for_phase(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop what another phase of the same test command answers: in the services phase the
    tests the SQLite phase answered for good; in a SQLite phase a services phase follows, the
    ``one_backend`` tests."""
    phase = os.environ.get(PHASE_VARIABLE)
    kept = [item for item in items if _runs_here(item, phase)]
    dropped = [item for item in items if not _runs_here(item, phase)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept

"""Both paths of each write: a test marked ``@both_write_paths`` runs once per path, and its
``write_path`` fixture (tests/conftest.py) says which.

* ``fast``: a transactional test (no outer atomic block), so each write tries its batched path
  first, as in production: on PostgreSQL its batches are sent together, on SQLite they run
  statement by statement.
* ``exact``: every write held to its exact path (``loops.db.exact_path_forced``), on both
  databases.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest

FAST = "fast"
EXACT = "exact"

#: The marks of :func:`both_write_paths`, for a module's ``pytestmark``.
BOTH_WRITE_PATHS = [
    pytest.mark.usefixtures("write_path"),
    pytest.mark.parametrize(
        "write_path",
        [
            pytest.param(FAST, marks=pytest.mark.django_db(transaction=True), id="fast"),
            pytest.param(EXACT, marks=pytest.mark.django_db, id="exact"),
        ],
        indirect=True,
    ),
]

T = TypeVar("T", bound=Callable[..., Any])


def both_write_paths(test: T) -> T:
    """Run ``test`` on each path of the writes it makes (its database access comes with it)."""
    for mark in reversed(BOTH_WRITE_PATHS):
        test = mark(test)
    return test

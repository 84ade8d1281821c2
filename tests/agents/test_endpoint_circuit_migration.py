"""Endpoint breaker rows move from ``loops_circuitstate`` to ``agents_endpointcircuit``; pattern
breakers stay where they are."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

LOOPS = ("loops", "0006_fewer_indexes")
BEFORE = [("agents", "0002_endpoint_circuit")]
AFTER = [("agents", "0003_endpoint_circuits_from_loops")]
OPENED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.fixture
def latest_schema_after() -> Iterator[None]:
    """Migrate back to the latest migrations afterwards: the tests that follow on this
    database expect every column (``AFTER`` is not the newest migration of the app)."""
    yield
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("latest_schema_after")
def test_endpoint_rows_move_with_their_state_and_pattern_rows_stay() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state([*BEFORE, LOOPS]).apps.get_model("loops", "CircuitState")
    old.objects.create(
        key="model-endpoint:primary", state="open", consecutive_failures=3,
        opened_at=OPENED, cooldown_seconds=120, probe_owner="",
    )  # fmt: skip
    old.objects.create(key="pattern:nightly", state="half_open", probe_owner="run-1")

    executor = MigrationExecutor(connection)
    executor.migrate(AFTER)
    apps = executor.loader.project_state([*AFTER, LOOPS]).apps
    moved = apps.get_model("agents", "EndpointCircuit").objects.get()
    assert (moved.key, moved.state, moved.consecutive_failures) == (
        "model-endpoint:primary",
        "open",
        3,
    )
    assert (moved.opened_at, moved.cooldown_seconds) == (OPENED, 120)
    kept = apps.get_model("loops", "CircuitState").objects.values_list("key", "state")
    assert list(kept) == [("pattern:nightly", "half_open")]

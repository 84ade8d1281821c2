"""Every engine benchmark works in smoke mode (tiny sizes; the figures are not judged here).

Benchmarks are not timed tests: ``make bench`` measures, CI only checks that they run. They
create their own scratch databases (``lw_bench_*``, or ``$LOOPWRIGHT_BENCH_DB_PREFIX*``) on the
configured PostgreSQL server and use Redis db 10 (or ``$LOOPWRIGHT_BENCH_REDIS``), so they run in
the PostgreSQL + Redis suite only. The LangGraph peer is switched
off here: smoke mode must not need it, and without it the rows say so and carry no ratio.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from django.db import connection

from bench import common, peer_langgraph
from bench.__main__ import BENCHMARKS

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

#: Every benchmark of ``python -m bench`` but the peer's own rows (tested below): the test command
#: is where CI checks that each one runs.
BENCHES = [name for name in BENCHMARKS if name != "peer_langgraph"]
REQUIRED = {"figure", "target", "passed"}


@pytest.fixture
def without_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the benchmarks run on PostgreSQL + Redis (scratch databases on the server)")
    if not common.redis_available():
        pytest.skip(f"no Redis at {common.BENCH_REDIS}")
    monkeypatch.setattr(peer_langgraph, "available", lambda: False)


def _measured(row: dict[str, Any]) -> bool:
    return any(row.get(key) is not None for key in ("median", "median_ms"))


@pytest.mark.parametrize("name", BENCHES)
def test_each_benchmark_produces_its_rows_in_smoke_mode(name: str, without_peer: None) -> None:
    rows = importlib.import_module(f"bench.{name}").run(smoke=True)
    assert rows
    for row in rows:
        assert set(row) >= REQUIRED, row
        assert _measured(row), row


def test_without_the_peer_its_rows_say_so_and_carry_no_ratio(without_peer: None) -> None:
    [row] = peer_langgraph.run(smoke=True)
    assert "peer not installed" in row["note"]
    assert peer_langgraph.step_overhead(20, smoke=True)["p50"] is None

"""The floor under every figure: what the PostgreSQL server itself does, measured in the same run.

On a scratch ``lw_bench_raw_*`` database of the same server, with bare psycopg (no Django):

* **commit loop**: one-row ``INSERT`` + ``COMMIT``, with 1 client and with 4 (threads, one
  connection each; psycopg releases the GIL while it waits on the server) — commits per second;
  and with 4 clients each transaction also sending a ``NOTIFY`` (what the engine's writes no
  longer do: ``orchestrator/wakeups.py``);
* **one-transaction step**: what the issue calls a step's bare cost: insert the step row
  (JSON request and response), two events and a span, and update the run's counters, in one
  transaction — ms per step;
* **SKIP LOCKED claim loop**: 4 clients claim queued jobs one at a time
  (``UPDATE … WHERE id = (SELECT … FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING``) and complete each
  with a guarded ``UPDATE`` — jobs per second.

The figures are measured once per bench process (cached) and used as the reference of the other
benchmarks' rows. ``python -m bench.raw_reference``.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from bench import common

ISSUE = {"commit_1": 1850.0, "commit_4": 4500.0, "step_tx_ms": 1.4, "claims_4": 1800.0}

_SCHEMA = [
    "CREATE TABLE commits (id bigserial PRIMARY KEY, v text NOT NULL)",
    "CREATE TABLE runs (id bigint PRIMARY KEY, step_count int NOT NULL DEFAULT 0, "
    "event_seq int NOT NULL DEFAULT 0, updated_at timestamptz)",
    "CREATE TABLE steps (id bigserial PRIMARY KEY, run_id bigint NOT NULL, seq int NOT NULL, "
    "request jsonb NOT NULL, response jsonb, created_at timestamptz NOT NULL DEFAULT now(), "
    "UNIQUE (run_id, seq))",
    "CREATE TABLE events (id bigserial PRIMARY KEY, run_id bigint NOT NULL, seq int NOT NULL, "
    "type text NOT NULL, data jsonb NOT NULL, UNIQUE (run_id, seq))",
    "CREATE TABLE spans (id bigserial PRIMARY KEY, run_id bigint NOT NULL, name text NOT NULL, "
    "attributes jsonb NOT NULL, started_at timestamptz, ended_at timestamptz)",
    "CREATE TABLE jobs (id bigserial PRIMARY KEY, status text NOT NULL, owner text, "
    "token bigint NOT NULL DEFAULT 0)",
    "CREATE INDEX jobs_queued ON jobs (id) WHERE status = 'queued'",
]


def _connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)


def _commit_loop(url: str, seconds: float, notify: bool = False) -> int:
    done = 0
    with _connect(url) as conn:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            with conn.transaction():
                conn.execute("INSERT INTO commits (v) VALUES ('x')")
                if notify:  # what a write announcing itself in its own transaction adds
                    conn.execute("SELECT pg_notify('bench_raw', 'x')")
            done += 1
    return done


def _parallel(clients: int, work: Callable[[], int]) -> float:
    """Run ``work`` in ``clients`` threads at once; returns items per second."""
    results: list[int] = []
    barrier = threading.Barrier(clients + 1)

    def target() -> None:
        barrier.wait()
        results.append(work())

    threads = [threading.Thread(target=target) for _ in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    return sum(results) / (time.perf_counter() - started)


def _step_loop(url: str, steps: int) -> list[float]:
    request = json.dumps({"arguments": {"i": 1}, "call_id": "call_1", "index": 0})
    response = json.dumps({"content": "ok"})
    timings = []
    with _connect(url) as conn:
        conn.execute("INSERT INTO runs (id) VALUES (1) ON CONFLICT DO NOTHING")
        for _ in range(steps):
            started = time.perf_counter()
            with conn.transaction():
                seq, ev = conn.execute(
                    "UPDATE runs SET step_count = step_count + 1, event_seq = event_seq + 2, "
                    "updated_at = clock_timestamp() WHERE id = 1 RETURNING step_count, event_seq"
                ).fetchone()
                conn.execute(
                    "INSERT INTO steps (run_id, seq, request, response) VALUES (1, %s, %s, %s)",
                    [seq, request, response],
                )
                for offset in (1, 0):
                    conn.execute(
                        "INSERT INTO events (run_id, seq, type, data) VALUES (1, %s, 'step', %s)",
                        [ev - offset, response],
                    )
                conn.execute(
                    "INSERT INTO spans (run_id, name, attributes, started_at, ended_at) "
                    "VALUES (1, 'tool', %s, now(), clock_timestamp())",
                    [request],
                )
            timings.append((time.perf_counter() - started) * 1000)
    return timings


def _claim_loop(url: str, owner: str) -> int:
    claim = (
        "UPDATE jobs SET status = 'running', owner = %s, token = token + 1 WHERE id = ("
        "SELECT id FROM jobs WHERE status = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED"
        ") RETURNING id, token"
    )
    complete = "UPDATE jobs SET status = 'done' WHERE id = %s AND owner = %s AND token = %s"
    done = 0
    with _connect(url) as conn:
        while True:
            row = conn.execute(claim, [owner]).fetchone()
            if row is None:
                if conn.execute("SELECT 1 FROM jobs WHERE status = 'queued' LIMIT 1").fetchone():
                    continue  # the rest is locked by the other claimers right now
                return done
            conn.execute(complete, [row[0], owner, row[1]])
            done += 1


def _claims_per_second(url: str, jobs: int, clients: int) -> float:
    with _connect(url) as conn:
        conn.execute("TRUNCATE jobs")
        conn.execute(
            "INSERT INTO jobs (status) SELECT 'queued' FROM generate_series(1, %s)", [jobs]
        )
        conn.execute("VACUUM ANALYZE jobs")
    counter = iter(range(clients))
    rate = _parallel(clients, lambda: _claim_loop(url, f"claimer-{next(counter)}"))
    with _connect(url) as conn:
        left = conn.execute("SELECT count(*) FROM jobs WHERE status <> 'done'").fetchone()[0]
    if left:
        raise AssertionError(f"{left} jobs were not completed by the claim loop")
    return rate


def _measure(url: str, smoke: bool) -> dict[str, Any]:
    seconds, steps, jobs, repeats = (0.3, 50, 200, 1) if smoke else (2.0, 1000, 4000, 3)
    keys = ("commit_1", "commit_4", "commit_4_notify", "claims_4")
    samples: dict[str, list[float]] = {k: [] for k in keys}
    step_p50: list[float] = []
    step_p99: list[float] = []
    with _connect(url) as conn:
        for statement in _SCHEMA:
            conn.execute(statement)
    for _ in range(repeats):  # interleaved, so drift on the shared machine hits all alike
        samples["commit_1"].append(_commit_loop(url, seconds) / seconds)
        samples["commit_4"].append(_parallel(4, lambda: _commit_loop(url, seconds)))
        samples["commit_4_notify"].append(
            _parallel(4, lambda: _commit_loop(url, seconds, notify=True))
        )
        timings = _step_loop(url, steps)
        step_p50.append(statistics.median(timings))
        step_p99.append(common.percentile(timings, 99))
        samples["claims_4"].append(_claims_per_second(url, jobs, 4))
    out: dict[str, Any] = {k: round(statistics.median(v), 1) for k, v in samples.items()}
    out.update(
        step_tx_ms=round(statistics.median(step_p50), 3),
        step_tx_p99_ms=round(statistics.median(step_p99), 3),
        spreads={
            **{k: common.spread(v) for k, v in samples.items()},
            "step": common.spread(step_p50),
        },
        load=common.load_average(),
    )
    return out


_cache: dict[bool, dict[str, Any]] = {}


def figures(smoke: bool = False) -> dict[str, Any]:
    """The raw figures (measured once per process and smoke mode)."""
    if smoke not in _cache:
        with common.ScratchDatabase("raw") as db:
            _cache[smoke] = _measure(db.url, smoke)
    return _cache[smoke]


def run(smoke: bool = False) -> list[dict[str, Any]]:
    raw = figures(smoke)
    spreads = raw["spreads"]

    def ref(key: str, unit: str) -> str:
        return f"issue's figure for this machine kind: {ISSUE[key]:g}{unit}"

    return [
        common.row(
            "raw commit loop, 1 client (PostgreSQL)",
            "reference",
            passed=None,
            median=raw["commit_1"],
            unit="/s",
            spread=spreads["commit_1"],
            ratio=common.ratio(raw["commit_1"], ISSUE["commit_1"]),
            reference=ref("commit_1", "/s"),
        ),
        common.row(
            "raw commit loop, 4 clients (PostgreSQL)",
            "reference",
            passed=None,
            median=raw["commit_4"],
            unit="/s",
            spread=spreads["commit_4"],
            ratio=common.ratio(raw["commit_4"], ISSUE["commit_4"]),
            reference=ref("commit_4", "/s"),
        ),
        common.row(
            "raw commit loop, 4 clients, a NOTIFY in each transaction",
            "reference",
            passed=None,
            median=raw["commit_4_notify"],
            unit="/s",
            spread=spreads["commit_4_notify"],
            ratio=common.ratio(raw["commit_4_notify"], raw["commit_4"]),
            reference="the commit loop without NOTIFY, 4 clients, same run (PostgreSQL serialises "
            "the commits of transactions that notify: orchestrator/wakeups.py)",
        ),
        common.row(
            "raw one-transaction step (row, 2 events, span, run update)",
            "reference",
            passed=None,
            median_ms=raw["step_tx_ms"],
            p99_ms=raw["step_tx_p99_ms"],
            spread=spreads["step"],
            ratio=common.ratio(raw["step_tx_ms"], ISSUE["step_tx_ms"]),
            reference=ref("step_tx_ms", " ms"),
        ),
        common.row(
            "raw SKIP LOCKED claim+complete loop, 4 clients",
            "reference",
            passed=None,
            median=raw["claims_4"],
            unit="/s",
            spread=spreads["claims_4"],
            ratio=common.ratio(raw["claims_4"], ISSUE["claims_4"]),
            reference=ref("claims_4", "/s"),
        ),
    ]


if __name__ == "__main__":
    for line in run(smoke="--smoke" in sys.argv):
        print(line)

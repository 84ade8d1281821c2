"""A journal write behind PgBouncer: arguments inline (what ships) against psycopg's pipeline mode.

Behind a transaction pooler the engine's one-round-trip batches cannot use SQL-level ``PREPARE``
(the next transaction may run on another server session), so they go out as one simple-protocol
query with the arguments rendered as literals (``loops.db._SentInline``). psycopg's pipeline
mode is the other way to keep one round trip: each statement in the extended protocol with its
own bound parameters (unnamed, so nothing outlives the transaction), one ``Sync`` at the end.

On a scratch ``lw_bench_pooler_*`` database, with bare psycopg: the fenced step write of the
engine (the run row updated under its lease, the step and two events inserted from it, in one
transaction), p50 ms per write over ``WRITES`` writes, repeats interleaved, in three ways:

* **direct, prepared**: straight to PostgreSQL, ``PREPARE`` once and ``EXECUTE`` with literals
  (``loops.db._SentTogether``, the default without a pooler): the reference;
* **PgBouncer, inline**: through a real PgBouncer 1.18 in transaction pooling on loopback,
  literals in place (``_SentInline``);
* **PgBouncer, pipeline**: the same PgBouncer, pipeline mode.

Needs the ``pgbouncer`` binary (Debian: ``apt-get install pgbouncer``; says so when missing).
``python -m bench pooler_batches``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench import common

_SCHEMA = [
    "CREATE TABLE runs (id bigint PRIMARY KEY, owner text NOT NULL, token bigint NOT NULL, "
    "step_count int NOT NULL DEFAULT 0, event_seq int NOT NULL DEFAULT 0, updated_at timestamptz)",
    "CREATE TABLE steps (id bigserial PRIMARY KEY, run_id bigint NOT NULL, seq int NOT NULL, "
    "request jsonb NOT NULL, response jsonb, UNIQUE (run_id, seq))",
    "CREATE TABLE events (id bigserial PRIMARY KEY, run_id bigint NOT NULL, seq int NOT NULL, "
    "type text NOT NULL, actor text NOT NULL, data jsonb NOT NULL, UNIQUE (run_id, seq))",
    "INSERT INTO runs (id, owner, token) VALUES (1, 'bench:1', 7)",
]
#: The lease fence of every statement (constants: nothing from outside goes into this SQL).
_FENCE = "r.id = %s AND r.owner = %s AND r.token = %s"
_STATEMENTS = [
    "UPDATE runs r SET step_count = step_count + 1, event_seq = event_seq + 2, "  # noqa: S608
    "updated_at = clock_timestamp() WHERE " + _FENCE + " RETURNING step_count, event_seq",
    "INSERT INTO steps (run_id, seq, request, response) "  # noqa: S608
    "SELECT r.id, r.step_count, %s, %s FROM runs r WHERE " + _FENCE,
    "INSERT INTO events (run_id, seq, type, actor, data) "  # noqa: S608
    "SELECT r.id, r.event_seq - 1, 'step.started', %s, %s FROM runs r WHERE " + _FENCE,
    "INSERT INTO events (run_id, seq, type, actor, data) "  # noqa: S608
    "SELECT r.id, r.event_seq, 'step.completed', %s, %s FROM runs r WHERE " + _FENCE,
]
_FENCE_ARGS = (1, "bench:1", 7)
_REQUEST = json.dumps({"arguments": {"path": "notes/a.md", "i": 1}, "call_id": "call_1"})
_RESPONSE = json.dumps({"content": "ok", "bytes": 1234})
_ARGS = [
    list(_FENCE_ARGS),
    [_REQUEST, _RESPONSE, *_FENCE_ARGS],
    ["bench:1", _RESPONSE, *_FENCE_ARGS],
    ["bench:1", _RESPONSE, *_FENCE_ARGS],
]


def _numbered(sql: str) -> str:
    parts = sql.split("%s")
    return "".join(p + (f"${i}" if i < len(parts) else "") for i, p in enumerate(parts, 1))


def _connect(url: str, **options: Any) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True, **options)


def _prepared_writes(url: str, writes: int) -> list[float]:
    import psycopg
    from psycopg.adapt import Transformer

    with _connect(url) as conn:
        cursor = psycopg.ClientCursor(conn)
        literal = Transformer.from_context(conn).as_literal
        names = [
            "lw_" + hashlib.sha1(s.encode(), usedforsecurity=False).hexdigest()[:24]
            for s in _STATEMENTS
        ]
        for name, sql in zip(names, _STATEMENTS, strict=True):
            cursor.execute(f"PREPARE {name} AS {_numbered(sql)}".encode())
        timings = []
        for _ in range(writes):
            started = time.perf_counter()
            parts = [b"BEGIN"]
            for name, args in zip(names, _ARGS, strict=True):
                parts.append(
                    f"EXECUTE {name}(".encode() + b", ".join(literal(a) for a in args) + b")"
                )
            parts.append(b"COMMIT")
            cursor.execute(b"; ".join(parts))
            timings.append((time.perf_counter() - started) * 1000)
    return timings


def _inline_writes(url: str, writes: int) -> list[float]:
    import psycopg
    from psycopg.adapt import Transformer

    with _connect(url, prepare_threshold=None) as conn:
        cursor = psycopg.ClientCursor(conn)
        literal = Transformer.from_context(conn).as_literal
        pieces = [[p.encode() for p in sql.split("%s")] for sql in _STATEMENTS]
        timings = []
        for _ in range(writes):
            started = time.perf_counter()
            parts = [b"BEGIN"]
            for split, args in zip(pieces, _ARGS, strict=True):
                statement = [split[0]]
                for value, piece in zip(args, split[1:], strict=True):
                    statement += [literal(value), piece]
                parts.append(b"".join(statement))
            parts.append(b"COMMIT")
            cursor.execute(b"; ".join(parts))
            timings.append((time.perf_counter() - started) * 1000)
    return timings


def _pipeline_writes(url: str, writes: int) -> list[float]:
    with _connect(url, prepare_threshold=None) as conn:
        timings = []
        for _ in range(writes):
            started = time.perf_counter()
            # BEGIN and COMMIT as statements of the pipeline: one Sync, at its end (a
            # transaction() block would sync at its own exit too).
            with conn.pipeline():
                conn.execute("BEGIN")
                for sql, args in zip(_STATEMENTS, _ARGS, strict=True):
                    conn.execute(sql, args)
                conn.execute("COMMIT")
            timings.append((time.perf_counter() - started) * 1000)
    return timings


class _PgBouncer:
    """``python -m tests.support.pgbouncer`` in front of the bench's server, for one measure."""

    def __init__(self) -> None:
        parts = urlsplit(common.server_url())
        upstream = f"{parts.hostname or '127.0.0.1'}:{parts.port or 5432}"
        self.log = common.log_dir("pooler_batches") / "pgbouncer.log"
        argv = [sys.executable, "-m", "tests.support.pgbouncer", "--upstream", upstream]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                argv, cwd=common.ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.port = self._wait_port()

    def _wait_port(self) -> int:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for line in Path(self.log).read_text().splitlines():
                if line.startswith("PGBOUNCER_PORT="):
                    return int(line.split("=", 1)[1])
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"pgbouncer did not start: {Path(self.log).read_text()[-2000:]}")

    def url(self, direct: str) -> str:
        parts = urlsplit(direct)
        return urlunsplit((parts.scheme, f"postgres@127.0.0.1:{self.port}", parts.path, "", ""))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def pgbouncer_missing() -> str | None:
    if shutil.which("pgbouncer") or Path("/usr/sbin/pgbouncer").exists():
        return None
    return "pgbouncer is not installed (apt-get install pgbouncer)"


def _measure(smoke: bool) -> dict[str, Any]:
    writes, repeats = (50, 1) if smoke else (2000, 3)
    samples: dict[str, list[float]] = {"prepared": [], "inline": [], "pipeline": []}
    with common.ScratchDatabase("pooler") as db:
        with _connect(db.url) as conn:
            for statement in _SCHEMA:
                conn.execute(statement)
        bouncer = _PgBouncer()
        try:
            pooled = bouncer.url(db.url)
            for _ in range(repeats):  # interleaved: drift on the machine hits all three alike
                samples["prepared"].append(statistics.median(_prepared_writes(db.url, writes)))
                samples["inline"].append(statistics.median(_inline_writes(pooled, writes)))
                samples["pipeline"].append(statistics.median(_pipeline_writes(pooled, writes)))
        finally:
            bouncer.stop()
    return {k: (statistics.median(v), common.spread(v)) for k, v in samples.items()}


def run(smoke: bool = False) -> list[dict[str, Any]]:
    missing = pgbouncer_missing()
    if missing:
        print(f"pooler_batches: not measured: {missing}")
        return []
    figures = _measure(smoke)
    prepared, inline, pipeline = (figures[k] for k in ("prepared", "inline", "pipeline"))
    return [
        common.row(
            "journal write, direct, PREPAREd (no pooler)",
            "reference",
            passed=None,
            median_ms=prepared[0],
            spread=prepared[1],
        ),
        common.row(
            "journal write through PgBouncer, arguments inline (ships)",
            "reference",
            passed=None,
            median_ms=inline[0],
            spread=inline[1],
            ratio=common.ratio(inline[0], prepared[0]),
            reference="direct, PREPAREd",
        ),
        common.row(
            "journal write through PgBouncer, psycopg pipeline mode",
            "informative: against inline",
            passed=None,
            median_ms=pipeline[0],
            spread=pipeline[1],
            ratio=common.ratio(pipeline[0], inline[0]),
            reference="through PgBouncer, inline",
        ),
    ]


if __name__ == "__main__":
    for result in run("--smoke" in sys.argv):
        print(result)

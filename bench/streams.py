"""Live run streams (``GET /api/v1/runs/{id}/stream``) on one web process, on PostgreSQL.

* **Idle cost.** ``STREAMS`` clients follow one run through one uvicorn process
  (``orchestrator.asgi``) and nothing is written. The database's transactions per second
  (``pg_stat_database``: ``xact_commit + xact_rollback`` of the bench database, the two reads'
  own included; each statement outside a transaction is one) are counted over an idle window.
  PostgreSQL 15 reports a backend's counts up to ``PGSTAT_IDLE_INTERVAL`` (10 s) late, so the
  window starts ``SETTLE_S`` after the last stream opened and is read again ``FLUSH_S`` after it
  closed; the streams stay idle throughout, so the whole span is idle. Target: < 5 per second.
* **Wake-up latency.** Then ``MARKS`` events are written one at a time (``run_event_append``
  from the measuring process, a commit and its ``NOTIFY``), ``GAP_S`` apart; each stream's time
  from just before the write to the moment the event's bytes arrived is one sample. Target:
  p99 <= 100 ms over every stream and event.

The clients are raw asyncio connections in the measuring process (HTTP/1.1, the body scanned
for the event's mark), so they cost as little as a client can. The database is
``lw_streams_bench`` (``LOOPWRIGHT_BENCH_STREAMS_DB``) on the server of ``DATABASE_URL``,
created, migrated and dropped here. ``python -m bench.streams [--smoke]`` prints the rows;
``python -m bench streams`` runs it with the others.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.common import (
    _migrate,
    child_main,
    free_port,
    log_dir,
    percentile,
    pg_admin,
    pg_url,
    row,
    run_child,
    server_url,
    wait_http,
    web_proc,
)

DB_NAME = os.environ.get("LOOPWRIGHT_BENCH_STREAMS_DB", "lw_streams_bench")
STREAMS, MARKS, IDLE_S = 500, 20, 10.0
SETTLE_S, FLUSH_S, GAP_S = 12.0, 11.0, 0.3
TARGET_QPS, TARGET_P99_MS = 5.0, 100.0


# --- the measuring child ---------------------------------------------------------------------


def _run_id() -> str:
    from loops.models import LoopEvent, LoopPattern, LoopRun, RunStatus

    pattern = LoopPattern.objects.create(
        key=f"bench-streams-{uuid.uuid4().hex[:6]}",
        goal_template="Follow me",
        leader_username="leader",
        maker_usernames=["maker"],
        verifier_username="verifier",
    )
    run = LoopRun.objects.create(
        pattern=pattern, status=RunStatus.RUNNING, goal="Follow me", event_seq=1
    )
    LoopEvent.objects.create(run=run, seq=1, type="run.created", to_status=RunStatus.QUEUED)
    return str(run.id)


def _write_mark(run_id: str, mark: str) -> None:
    from django.db import connection

    from loops.services.transitions import run_event_append

    if not mark:  # the writer's thread is done: give its connection back
        connection.close()
        return
    run_event_append(run_id=uuid.UUID(run_id), type="bench.mark", actor="bench", data={"m": mark})


def _open_writer() -> None:
    """Open the writer thread's connection, so a mark's time holds its write, not a connect."""
    from django.db import connection

    connection.ensure_connection()


def _transactions() -> int:
    """The bench database's committed and rolled back transactions so far (one itself)."""
    import psycopg

    with psycopg.connect(pg_url("postgres"), autocommit=True) as conn:
        found = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
            [DB_NAME],
        ).fetchone()
    return int(found[0]) if found else 0


class _Marks:
    """The mark being written, when, and what the streams saw of it."""

    def __init__(self, streams: int) -> None:
        self.streams = streams
        self.mark = b""
        self.sent = 0.0
        self.seen = 0
        self.samples: list[float] = []
        self.per_mark: list[list[float]] = []
        self.all_seen = asyncio.Event()
        self.closed = 0

    def arm(self, mark: str) -> None:
        self.mark, self.seen, self.sent = mark.encode(), 0, time.monotonic()
        self.per_mark.append([])
        self.all_seen.clear()

    def saw(self) -> None:
        self.samples.append((time.monotonic() - self.sent) * 1000)
        self.per_mark[-1].append(self.samples[-1])
        self.seen += 1
        if self.seen == self.streams:
            self.all_seen.set()


async def _open(
    port: int, path: str, token: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A stream's connection (the writer kept: dropping it closes the connection)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"stream refused: {status!r}")
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    return reader, writer


async def _follow(reader: asyncio.StreamReader, marks: _Marks, ready: asyncio.Event) -> None:
    buffer = b""
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            marks.closed += 1
            return
        buffer += chunk
        if not ready.is_set() and b"event: run" in buffer:
            ready.set()
        if marks.mark and marks.mark in buffer:
            marks.saw()
            buffer = b""
        else:
            buffer = buffer[-200:]


async def _measure(args: argparse.Namespace, port: int, token: str, run_id: str) -> dict[str, Any]:
    marks = _Marks(args.streams)
    path = f"/api/v1/runs/{run_id}/stream"
    tasks, readies, writers = [], [], []
    opened = time.monotonic()
    for start in range(0, args.streams, 50):
        batch = [_open(port, path, token) for _ in range(min(50, args.streams - start))]
        for reader, writer in await asyncio.gather(*batch):
            writers.append(writer)
            ready = asyncio.Event()
            readies.append(ready)
            tasks.append(asyncio.create_task(_follow(reader, marks, ready)))
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 120)
    open_s = time.monotonic() - opened
    await asyncio.sleep(args.settle)
    before, began = await asyncio.to_thread(_transactions), time.monotonic()
    await asyncio.sleep(args.idle + args.flush)
    after, ended = await asyncio.to_thread(_transactions), time.monotonic()
    idle_qps = (after - before) / (ended - began)
    missed = 0
    # The 500 clients stand for 500 browsers: this process's own collector pauses are not the
    # server's latency, so it collects nothing while the events are timed.
    gc.collect()
    gc.freeze()
    gc.disable()
    loop = asyncio.get_running_loop()
    writer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-writer")
    await loop.run_in_executor(writer_thread, _open_writer)
    for n in range(args.marks):
        marks.arm(f"mark-{n}-{uuid.uuid4().hex[:8]}")
        await loop.run_in_executor(writer_thread, _write_mark, run_id, marks.mark.decode())
        try:
            await asyncio.wait_for(marks.all_seen.wait(), 10)
        except TimeoutError:
            missed += args.streams - marks.seen
        await asyncio.sleep(GAP_S)
    await loop.run_in_executor(writer_thread, _write_mark, run_id, "")
    writer_thread.shutdown()
    gc.enable()
    gc.unfreeze()
    for task in tasks:
        task.cancel()
    for writer in writers:
        writer.close()
    return {
        "streams": args.streams,
        "open_s": round(open_s, 2),
        "idle_window_s": round(ended - began, 1),
        "idle_transactions": after - before,
        "idle_qps": round(idle_qps, 3),
        "samples": marks.samples,
        "worst_per_mark_ms": [round(max(m), 1) for m in marks.per_mark if m],
        "missed": missed,
        "closed": marks.closed,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from bench.common import api_token

    logs = log_dir("streams-web")
    port = free_port()
    web_proc(dict(os.environ), logs, port).start()
    wait_http(f"http://127.0.0.1:{port}/healthz")
    token, run_id = api_token(), _run_id()
    return asyncio.run(_measure(args, port, token, run_id))


# --- the runner ------------------------------------------------------------------------------


def _database() -> tuple[str, str]:
    """A fresh, migrated ``DB_NAME``; its URL and a var dir."""
    pg_admin(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
    pg_admin(f'CREATE DATABASE "{DB_NAME}"')
    var_dir = tempfile.mkdtemp(prefix="lw-bench-streams-")
    _migrate(pg_url(DB_NAME), var_dir)
    return pg_url(DB_NAME), var_dir


def run(smoke: bool = False) -> list[dict[str, Any]]:
    if not server_url().startswith(("postgres://", "postgresql://")):
        return [row("run streams", "PostgreSQL", passed=None, note="needs PostgreSQL")]
    streams, marks, idle = (20, 3, 2.0) if smoke else (STREAMS, MARKS, IDLE_S)
    settle, flush = (1.0, 1.0) if smoke else (SETTLE_S, FLUSH_S)
    url, var_dir = _database()
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "LOOPWRIGHT_VAR_DIR": var_dir,
        "CELERY_BROKER_URL": "memory://",
        "DJANGO_SETTINGS_MODULE": "orchestrator.settings",
        "LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("REDIS_URL", None)
    args = ["--streams", str(streams), "--marks", str(marks), "--idle", str(idle)]
    args += ["--settle", str(settle), "--flush", str(flush)]
    try:
        found = run_child("bench.streams", env, args, 900, log_dir("streams"))
    finally:
        pg_admin(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        shutil.rmtree(var_dir, ignore_errors=True)
    samples = found["samples"]
    p50, p99 = percentile(samples, 50), percentile(samples, 99)
    return [
        row(
            f"{found['streams']} idle run streams, one web process: database transactions/s",
            f"< {TARGET_QPS:g}/s",
            passed=found["idle_qps"] < TARGET_QPS,
            median=found["idle_qps"],
            unit="/s",
            window_s=found["idle_window_s"],
            transactions=found["idle_transactions"],
            opened_in_s=found["open_s"],
        ),
        row(
            f"event written → received by all {found['streams']} streams (p99)",
            f"p99 <= {TARGET_P99_MS:g} ms",
            passed=not found["missed"] and p99 <= TARGET_P99_MS,
            median_ms=p50,
            p99_ms=round(p99, 2),
            max_ms=round(max(samples), 2) if samples else None,
            samples=len(samples),
            missed=found["missed"],
            worst_per_event_ms=found.get("worst_per_mark_ms"),
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.streams")
    sub = parser.add_subparsers(dest="mode")
    child = sub.add_parser("child")
    child.add_argument("--out", required=True)
    child.add_argument("--streams", type=int, default=STREAMS)
    child.add_argument("--marks", type=int, default=MARKS)
    child.add_argument("--idle", type=float, default=IDLE_S)
    child.add_argument("--settle", type=float, default=SETTLE_S)
    child.add_argument("--flush", type=float, default=FLUSH_S)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.mode == "child":
        child_main(measure, args)
        return
    for found in run(smoke=args.smoke):
        print(found)


if __name__ == "__main__":
    sys.exit(main())

"""Trigger latency: the cron scheduler tick over 10,000 patterns, and event → run queued.

Everything runs in a scratch database this command creates and migrates (a SQLite file in a
temporary directory by default; ``lw_bench_sched`` on the server when ``DATABASE_URL`` points to
PostgreSQL, dropped afterwards). It never touches another database. The measurements run in
child processes (``python -m bench.scheduler tick|event``) configured for that database.

Rows:

- **scheduler tick, 10,000 cron patterns**: a simulated hour of ticks every 15 s (the default
  beat interval) over 10,000 cron patterns (70% daily, 20% weekly, 8% hourly, 2% every 15
  minutes, in five time zones): ~30 fires per simulated minute, and the scan for stale schedule
  rows once a minute, as the periodic task does. ``median_ms``/``p99_ms`` are the scheduler's
  own work per tick (the scan, claiming due schedules, recording fires, moving schedules on),
  i.e. the tick minus the time spent inside ``run_trigger`` creating the runs, which is the same
  cost a manual trigger pays; ``tick_with_runs_*`` give the whole tick for transparency, and
  ``tick_cpu_median_ms`` this process's CPU time per tick (less sensitive to a busy machine,
  whose load average is recorded too).
- **cron fires started per second, burst**: 1,000 patterns due at the same minute, one tick.
- **event -> run queued latency**: a signed ``POST /api/v1/events/{key}`` through Django's
  test client (in process), from the start of the request to the response, which is sent
  after the run row has committed.

``spread`` is half the p10-p90 range relative to the median. ``python -m bench.scheduler
[--smoke]`` prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = os.environ.get("LOOPWRIGHT_BENCH_DB_PREFIX", "lw_bench_") + "sched"
TICK_TARGET_MS = 200.0
BURST_TARGET = 50.0
EVENT_TARGET_MS = 50.0
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Australia/Sydney"]
T0 = datetime(2030, 1, 7, 0, 0, tzinfo=UTC)  # a Monday


# --- child processes: the measurements ---------------------------------------------------------


def _expression(rng: random.Random) -> str:
    roll, minute, hour = rng.random(), rng.randrange(60), rng.randrange(24)
    if roll < 0.70:
        return f"{minute} {hour} * * *"
    if roll < 0.90:
        return f"{minute} {hour} * * {rng.randrange(7)}"
    if roll < 0.98:
        return f"{minute} * * * *"
    return f"{minute % 15}-59/15 * * * *"


def _seed_cron(count: int, prefix: str, expression: str | None, now: datetime) -> None:
    from django.db import connection

    from loops.models import CronSchedule, LoopPattern
    from loops.services.schedules import schedule_new

    rng = random.Random(f"{prefix}-{count}")
    patterns = LoopPattern.objects.bulk_create(
        [
            LoopPattern(
                key=f"{prefix}-{n:05d}",
                goal_template="Scheduled run for {{ event.scheduled_for }}",
                trigger_type="cron",
                cron_expression=expression or _expression(rng),
                timezone=ZONES[n % len(ZONES)],
                leader_username="leader",
                maker_usernames=["maker"],
                verifier_username="verifier",
            )
            for n in range(count)
        ],
        batch_size=2000,
    )
    CronSchedule.objects.bulk_create([schedule_new(p, now=now) for p in patterns], batch_size=2000)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")


def _timed_run_creation() -> list[float]:
    """Wrap ``run_trigger`` so the child can tell the tick's own time from run creation."""
    import loops.services.runs as runs

    spent = [0.0]
    original = runs.run_trigger

    def timed(**kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(**kwargs)
        finally:
            spent[0] += time.perf_counter() - started

    runs.run_trigger = timed
    return spent


def tick_main(args: argparse.Namespace) -> dict[str, Any]:
    from loops.triggers.scheduler import cron_tick

    _seed_cron(args.patterns, "cron", None, T0)
    spent = _timed_run_creation()
    cron_tick(now=T0)  # warm-up: connections, caches
    whole, own, cpu, fires = [], [], [], []
    for n in range(1, args.minutes * 4 + 1):
        before, cpu_before = spent[0], time.process_time()
        started = time.perf_counter()
        # As the periodic task does: the scan for stale rows once a minute, not every tick.
        report = cron_tick(now=T0 + timedelta(seconds=15 * n), resync=n % 4 == 1)
        elapsed = time.perf_counter() - started
        whole.append(elapsed * 1000)
        own.append((elapsed - (spent[0] - before)) * 1000)
        cpu.append((time.process_time() - cpu_before) * 1000)
        fires.append(len(report.started) + report.refused)
        if report.errors:
            raise RuntimeError(f"tick errors: {report.as_dict()}")
    burst_at = T0 + timedelta(minutes=args.minutes, seconds=30)
    _seed_cron(args.burst, "burst", "* * * * *", burst_at)
    started = time.perf_counter()
    report = cron_tick(now=burst_at + timedelta(seconds=30), limit=args.burst * 2)
    burst_seconds = time.perf_counter() - started
    return {
        "own_ms": own,
        "whole_ms": whole,
        "cpu_ms": cpu,
        "fires": fires,
        "burst_fires": len(report.started),
        "burst_seconds": burst_seconds,
    }


def event_main(args: argparse.Namespace) -> dict[str, Any]:
    from django.test import Client

    from loops.models import LoopPattern, LoopRun
    from loops.triggers.events import event_key_create, signature_compute

    _, secret = event_key_create(key="bench", actor="bench")
    LoopPattern.objects.create(
        key="on-bench",
        goal_template="Handle {{ event.n }}",
        trigger_type="event",
        event_key="bench",
        leader_username="leader",
        maker_usernames=["maker"],
        verifier_username="verifier",
    )
    client = Client()
    timings, cpu = [], []
    for n in range(args.deliveries + 5):
        body = json.dumps({"n": n, "service": "api"}).encode()
        stamp = str(int(time.time()))
        started, cpu_started = time.perf_counter(), time.process_time()
        response = client.post(
            "/api/v1/events/bench",
            data=body,
            content_type="application/json",
            headers={
                "X-Loopwright-Timestamp": stamp,
                "X-Loopwright-Signature": "sha256=" + signature_compute(secret, stamp, body),
            },
        )
        elapsed = (time.perf_counter() - started) * 1000
        cpu_ms = (time.process_time() - cpu_started) * 1000
        if response.status_code != 202:
            raise RuntimeError(f"delivery {n}: {response.status_code} {response.content[:300]!r}")
        if n >= 5:  # the first few warm up connections and caches
            timings.append(elapsed)
            cpu.append(cpu_ms)
    if LoopRun.objects.filter(trigger_type="event").count() != args.deliveries + 5:
        raise RuntimeError("not every delivery left a committed run")
    return {"ms": timings, "cpu_ms": cpu}


def child_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler")
    sub = parser.add_subparsers(dest="mode", required=True)
    tick = sub.add_parser("tick")
    tick.add_argument("--patterns", type=int, required=True)
    tick.add_argument("--minutes", type=int, required=True)
    tick.add_argument("--burst", type=int, required=True)
    event = sub.add_parser("event")
    event.add_argument("--deliveries", type=int, required=True)
    args = parser.parse_args(argv)
    import django

    django.setup()
    result = tick_main(args) if args.mode == "tick" else event_main(args)
    print(json.dumps(result))


# --- the parent: scratch database and rows -----------------------------------------------------


def _pg_url(dbname: str) -> str:
    parts = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit((parts.scheme, parts.netloc, f"/{dbname}", "", ""))


def _pg_admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(_pg_url("postgres"), autocommit=True) as conn:
        conn.execute(sql)


def _python(env: dict[str, str], *argv: str, timeout: float = 3600) -> str:
    result = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env={**os.environ, **env}, capture_output=True,
        text=True, timeout=timeout,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"{argv} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return result.stdout


@contextmanager
def scratch_database() -> Iterator[dict[str, str]]:
    """A migrated scratch database; yields the environment for the child processes."""
    postgres = os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://"))
    with tempfile.TemporaryDirectory(prefix="lw-bench-sched-") as tmp:
        url = _pg_url(BENCH_DB) if postgres else f"sqlite:///{tmp}/bench.sqlite3"
        env = {
            "DATABASE_URL": url,
            "LOOPWRIGHT_VAR_DIR": tmp,
            "CELERY_BROKER_URL": "memory://",
            "DJANGO_SETTINGS_MODULE": "orchestrator.settings",
            "LOG_LEVEL": "WARNING",
        }
        if postgres:
            _pg_admin(f'DROP DATABASE IF EXISTS "{BENCH_DB}"')
            _pg_admin(f'CREATE DATABASE "{BENCH_DB}"')
        try:
            _python(env, "manage.py", "migrate", "--noinput", "-v", "0")
            yield env
        finally:
            if postgres:
                _pg_admin(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')


def _stats(values: list[float]) -> dict[str, Any]:
    median = statistics.median(values)
    deciles = statistics.quantiles(values, n=10)
    percentiles = statistics.quantiles(values, n=100)
    return {
        "median_ms": round(median, 2),
        "p99_ms": round(percentiles[98], 2),
        "spread": f"±{(deciles[8] - deciles[0]) / 2 / median:.0%}" if median else "-",
    }


def _rows(tick: dict[str, Any], event: dict[str, Any], patterns: int, vendor: str) -> list[Any]:
    own, whole = _stats(tick["own_ms"]), _stats(tick["whole_ms"])
    burst_rate = tick["burst_fires"] / tick["burst_seconds"]
    events = _stats(event["ms"])
    return [
        {
            "figure": f"scheduler tick, {patterns:,} cron patterns ({vendor})",
            "target": f"<= {TICK_TARGET_MS:g} ms",
            **own,
            "passed": own["p99_ms"] <= TICK_TARGET_MS,
            "ticks": len(tick["own_ms"]),
            "fires_per_tick_mean": round(statistics.mean(tick["fires"]), 2),
            "fires_per_tick_max": max(tick["fires"]),
            "tick_with_runs_median_ms": whole["median_ms"],
            "tick_with_runs_p99_ms": whole["p99_ms"],
            "tick_cpu_median_ms": round(statistics.median(tick["cpu_ms"]), 2),
            "tick_cpu_p99_ms": round(statistics.quantiles(tick["cpu_ms"], n=100)[98], 2),
            "load_average": os.getloadavg()[0],
        },
        {
            "figure": f"cron fires started per second, {tick['burst_fires']:,} due at once "
            f"({vendor})",
            "target": f">= {BURST_TARGET:g}/s",
            "median": round(burst_rate, 1),
            "unit": "/s",
            "passed": burst_rate >= BURST_TARGET,
        },
        {
            "figure": f"event -> run queued latency, signed POST ({vendor})",
            "target": f"<= {EVENT_TARGET_MS:g} ms",
            **events,
            "passed": events["median_ms"] <= EVENT_TARGET_MS,
            "deliveries": len(event["ms"]),
            "cpu_median_ms": round(statistics.median(event["cpu_ms"]), 2),
        },
    ]


def run(smoke: bool = False) -> list[dict[str, Any]]:
    patterns, minutes, burst, deliveries = (300, 10, 50, 20) if smoke else (10_000, 60, 1000, 200)
    with scratch_database() as env:
        vendor = "PostgreSQL" if env["DATABASE_URL"].startswith("postgres") else "SQLite"
        tick_argv = ["--patterns", str(patterns), "--minutes", str(minutes), "--burst", str(burst)]
        tick = json.loads(
            _python(env, "-m", "bench.scheduler", "tick", *tick_argv).splitlines()[-1]
        )
        event_out = _python(env, "-m", "bench.scheduler", "event", "--deliveries", str(deliveries))
        event = json.loads(event_out.splitlines()[-1])
    return _rows(tick, event, patterns, vendor)


def _print(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("tick", "event"):
        child_main(sys.argv[1:])
    else:
        _print(run(smoke="--smoke" in sys.argv))

"""Where each API call of ``bench.api_latency`` spends its time, in process.

The same set-up as ``bench.api_latency`` (the demo team, runs parked on their approvals by a
production worker, a scratch PostgreSQL database), then each call through Django's test client
(no uvicorn: the handler, the middleware, DRF and the services): its p50 over ``SAMPLES`` calls
and the CPU time this process spent on it (the server's excluded: steadier than the wall
clock on a shared machine), the SQL statements one call sends (``CaptureQueriesContext``) and
a cProfile listing of ``PROFILED`` calls, sorted by cumulative time. docs/performance.md,
*API latency*, reads it.
``python -m bench.api_profile [--out FILE]`` prints the figures and writes the whole report
(statements and listings) as JSON.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import common
from bench.api_latency import PATTERN, _park, _seed

WARMUP, SAMPLES, PROFILED = 10, 30, 30
PARKED = WARMUP + 1 + SAMPLES + PROFILED  # each decide takes a pending approval of its own


def _calls(client: Any) -> dict[str, Callable[[], Any]]:
    from loops.models import ActionApproval, ApprovalStatus, LoopRun

    pending = iter(
        list(
            ActionApproval.objects.filter(status=ApprovalStatus.PENDING)
            .order_by("id")
            .values_list("id", flat=True)
        )
    )
    run_id = LoopRun.objects.values_list("id", flat=True).first()
    body = "application/json"
    return {
        "run detail": lambda: client.get(f"/api/v1/runs/{run_id}"),
        "runs list": lambda: client.get(
            f"/api/v1/runs?status=waiting_approval&pattern={PATTERN}&limit=50"
        ),
        "trigger": lambda: client.post(
            f"/api/v1/patterns/{PATTERN}/trigger", {"inputs": {"path": "t.txt"}}, body
        ),
        "decide": lambda: client.post(
            f"/api/v1/approvals/{next(pending)}/decide", {"decision": "approve"}, body
        ),
    }


def _profile(call: Callable[[], Any]) -> dict[str, Any]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(WARMUP):
        answer = call()
        if answer.status_code not in (200, 201):
            raise RuntimeError(f"{answer.status_code}: {answer.content[:500]!r}")
    with CaptureQueriesContext(connection) as sent:
        call()
    statements = [query["sql"] for query in sent.captured_queries]  # the next request resets it
    times, cpu = [], []
    for _ in range(SAMPLES):
        started, used = time.perf_counter(), time.process_time()
        call()
        times.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - used) * 1000)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(PROFILED):
        call()
    profiler.disable()
    listing = io.StringIO()
    pstats.Stats(profiler, stream=listing).sort_stats("cumulative").print_stats(90)
    return {
        "p50_ms": statistics.median(times),
        "cpu_p50_ms": statistics.median(cpu),
        "statements": statements,
        "profile": listing.getvalue(),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from django.test import Client

    token = _seed(PARKED)
    env = common.service_env(LOOPWRIGHT_INVOKER="loops.worker.invoker.AgentInvoker")
    _park(PARKED, env, common.log_dir("api_profile"))
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    return {name: _profile(call) for name, call in _calls(client).items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.api_profile", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    child = sub.add_parser("child", help="(internal) measure in this process")
    child.add_argument("--out", required=True)
    parser.add_argument("--out", default="", help="write the whole report (JSON) here")
    args = parser.parse_args(argv)
    if args.command == "child":
        common.child_main(measure, args)
        return
    logs = common.log_dir("api_profile")
    with common.ScratchDatabase("api_profile") as db:
        report = common.run_child("bench.api_profile", db.env(), [], 1800, logs)
    for name, figures in report.items():
        count = len(figures["statements"])
        print(
            f"{name:12s} p50 {figures['p50_ms']:6.2f} ms  (this process's CPU "
            f"{figures['cpu_p50_ms']:5.2f} ms)  {count} statements"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])

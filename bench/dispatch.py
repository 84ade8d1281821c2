"""Dispatch latency: the trigger API returns → the run's first model request arrives.

The real service on a scratch PostgreSQL database: the web server (uvicorn, the production ASGI
app), one idle worker (``celery worker --pool threads`` with the run driver, Redis db 10 as the
broker) and the loopback model server, which timestamps the first request of each run with
``time.monotonic()`` (one clock for every process of the machine). The bench POSTs
``/api/v1/patterns/<key>/trigger`` and takes the time when the response is back; the figure is
the model server's arrival time minus that. The bench learns the arrival by one long-polled
request the model server answers when it comes, so no polling of the bench's competes with the
service for the machine's two cores while it is measured. What lies between: the nudge (sent on
commit, before the response), Celery delivering it, the driver's claim, preparation, loading the
employee and its model client, building the prompt, and the HTTP request to the model.

Each sample waits for the previous run to finish, so the worker is idle when the trigger comes.
``python -m bench.dispatch``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from typing import Any

from bench import common

TARGET_P50_MS, TARGET_P99_MS = 6.0, 15.0
TOOLS = [*common.NOOP_TOOLS, "read"]


def _breakdown(run_id: str, model_wall: float) -> dict[str, float]:
    """Where the time went, from the run's events (wall clock, ms after ``run.created``)."""
    from loops.models import LoopEvent

    first: dict[str, float] = {}
    for kind, at in (
        LoopEvent.objects.filter(run_id=uuid.UUID(run_id))
        .order_by("seq")
        .values_list("type", "created_at")
    ):
        first.setdefault(kind, at.timestamp())
    created = first["run.created"]
    marks: dict[str, float] = {
        k: first[k] for k in ("lease.claimed", "run.started", "invocation.started") if k in first
    }
    marks["model request"] = model_wall
    return {k: round((v - created) * 1000, 2) for k, v in marks.items()}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from loops import state

    terminal = [s.value for s in state.TERMINAL]
    service = common.Service("dispatch", prefix="dsp", maker_steps=1, tools=TOOLS)
    try:
        latencies, api_ms, breakdowns = [], [], []
        for n in range(args.warmup + args.samples):
            tag = uuid.uuid4().hex[:12]
            run_id, took, returned = service.trigger(tag=tag, steps=0)
            try:
                arrived, arrived_wall = service.model.first_request(tag)
            except TimeoutError as exc:
                raise TimeoutError(f"{exc}:\n{service.worker.log()}") from None
            common.wait_status([run_id], terminal, 60)
            if n >= args.warmup:
                latencies.append((arrived - returned) * 1000)
                api_ms.append(took * 1000)
                breakdowns.append(_breakdown(run_id, arrived_wall))
            time.sleep(args.idle)  # the worker is idle again, its poll asleep
    finally:
        service.close()
    return {
        "latencies_ms": latencies,
        "api_ms": api_ms,
        "breakdowns": breakdowns,
        "load": common.load_average(),
    }


def run(smoke: bool = False) -> list[dict[str, Any]]:
    if not common.redis_available():
        raise RuntimeError(f"Redis is needed at {common.BENCH_REDIS}")
    samples, repeats = (3, 1) if smoke else (40, 3)
    logs = common.log_dir("dispatch")
    p50s, p99s, api, breakdowns = [], [], [], []
    for _ in range(repeats):
        with common.ScratchDatabase("dispatch") as db:
            argv = ["--samples", str(samples), "--warmup", "1" if smoke else "3"]
            result = common.run_child("bench.dispatch", db.env(), argv, 1800, logs)
        p50s.append(statistics.median(result["latencies_ms"]))
        p99s.append(common.percentile(result["latencies_ms"], 99))
        api.append(statistics.median(result["api_ms"]))
        breakdowns += result["breakdowns"]
    p50, p99 = statistics.median(p50s), statistics.median(p99s)
    return [
        common.row(
            "dispatch: trigger API returned -> first model request (idle worker)",
            f"p50 <= {TARGET_P50_MS:g} ms, p99 <= {TARGET_P99_MS:g} ms",
            median_ms=p50,
            p99_ms=round(p99, 3),
            spread=common.spread(p50s),
            passed=p50 <= TARGET_P50_MS and p99 <= TARGET_P99_MS,
            repeat_p50s=[round(v, 2) for v in p50s],
            samples=samples * repeats,
            trigger_api_ms=round(statistics.median(api), 2),
            breakdown_ms_after_run_created={
                k: round(statistics.median(b[k] for b in breakdowns if k in b), 2)
                for k in breakdowns[0]
            },
            reference="issue: Celery + Redis no-op round trip p50 ~3.5 ms",
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dispatch", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    child = sub.add_parser("child", help="(internal) measure in this process")
    child.add_argument("--out", required=True)
    child.add_argument("--samples", type=int, default=40)
    child.add_argument("--warmup", type=int, default=3)
    child.add_argument("--idle", type=float, default=0.2)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "child":
        common.child_main(measure, args)
    else:
        for line in run(smoke=args.smoke):
            print(line)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Per-step overhead with spans on against spans off, in the same process and the same run.

The engine of ``bench.step_overhead`` (the real driver, journal and tool loop; an instant model
and a no-op tool) drives 20-step runs of two patterns, alternating run by run: one whose
harness records spans (the platform default), one whose harness sets
``observability.enabled`` to false. After each run with spans, the span sweep's store of that
run (``spans_record``, what the beat task does once the run has ended) is timed on its own: it
is off the step path, so it is reported per run and per model step, not in the step figure.
``python -m bench.span_overhead``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from typing import Any

from bench import common
from bench.step_overhead import StepInvoker, _run_once, steps_pattern, timed_driver

TARGET_RATIO = 1.1


def _patterns() -> dict[str, Any]:
    dark = {"harness": {"observability": {"enabled": False}}}
    return {
        "on": steps_pattern("bench-spans-on"),
        "off": steps_pattern("bench-spans-off", dark),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from loops.models import LoopRun, LoopSpan
    from loops.services.spans import spans_record

    patterns = _patterns()
    invoker = StepInvoker()
    driver = timed_driver(invoker=invoker, capacity=8, owner=f"bench-span-{uuid.uuid4().hex[:6]}")
    driver.start()
    steps: dict[str, list[list[float]]] = {"on": [], "off": []}
    record_ms: list[float] = []
    spans_per_run: list[int] = []
    try:
        for _ in range(args.warmup):
            for mode in ("on", "off"):
                _run_once(driver, invoker, patterns[mode], args.steps)
        for _ in range(args.repeats):
            repeat: dict[str, list[float]] = {"on": [], "off": []}
            for _ in range(args.runs):
                for mode in ("on", "off"):
                    repeat[mode] += _run_once(driver, invoker, patterns[mode], args.steps)[
                        "steps_ms"
                    ]
                run_id = LoopRun.objects.filter(pattern=patterns["on"]).values("id")[:1]
                started = time.perf_counter()
                spans_record(run_id=run_id[0]["id"])
                record_ms.append((time.perf_counter() - started) * 1000)
                spans_per_run.append(LoopSpan.objects.filter(run_id=run_id[0]["id"]).count())
            for mode in ("on", "off"):
                steps[mode].append(repeat[mode])
    finally:
        driver.stop(drain_seconds=5)
    return {
        "p50": {m: [statistics.median(r) for r in steps[m]] for m in steps},
        "p99": {m: [common.percentile(r, 99) for r in steps[m]] for m in steps},
        "record_ms": record_ms,
        "spans_per_run": spans_per_run,
        "model_steps_per_run": args.steps + 3,
        "load": common.load_average(),
    }


def measure_in_child(vendor: str, runs: int, repeats: int, warmup: int) -> dict[str, Any]:
    logs = common.log_dir(f"spans-{vendor}")
    argv = ["--steps", "20", "--runs", str(runs), "--repeats", str(repeats)]
    with common.ScratchDatabase("spans", vendor) as db:
        return dict(
            common.run_child(
                "bench.span_overhead", db.env(), [*argv, "--warmup", str(warmup)], 1800, logs
            )
        )


def _row(vendor: str, result: dict[str, Any]) -> dict[str, Any]:
    on = statistics.median(result["p50"]["on"])
    off = statistics.median(result["p50"]["off"])
    ratio = on / off
    record = statistics.median(result["record_ms"])
    return common.row(
        f"per-step overhead, spans on / spans off, 20-step runs ({vendor})",
        f"on <= {TARGET_RATIO:g} x off (same process, runs alternating)",
        median_ms=round(on, 3),
        passed=ratio <= TARGET_RATIO,
        ratio=round(ratio, 3),
        reference=f"spans off p50 {off:.3f} ms",
        p99_ms=round(statistics.median(result["p99"]["on"]), 3),
        off_p99_ms=round(statistics.median(result["p99"]["off"]), 3),
        spread=common.spread(result["p50"]["on"]),
        span_store_ms_per_run=round(record, 3),
        span_store_ms_per_model_step=round(record / result["model_steps_per_run"], 3),
        spans_per_run=statistics.median(result["spans_per_run"]),
        repeat_p50s={m: [round(v, 3) for v in result["p50"][m]] for m in ("on", "off")},
        load=result["load"],
    )


def run(smoke: bool = False) -> list[dict[str, Any]]:
    runs, repeats, warmup = (2, 1, 1) if smoke else (10, 3, 2)
    return [
        _row(vendor, measure_in_child(vendor, runs, repeats, warmup))
        for vendor in ("postgresql", "sqlite")
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.span_overhead", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    child = sub.add_parser("child", help="(internal) measure in this process")
    child.add_argument("--out", required=True)
    child.add_argument("--steps", type=int, default=20)
    child.add_argument("--runs", type=int, default=10)
    child.add_argument("--repeats", type=int, default=3)
    child.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "child":
        common.child_main(measure, args)
    else:
        for line in run(smoke=args.smoke):
            print(line)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Throughput of the whole service: 200 runs x 10 steps with a 50 ms model, on one machine.

The real service on a scratch PostgreSQL database: worker processes exactly as docs/worker.md
runs them (``celery worker --pool threads``, the run driver inside, Redis db 10 as the broker
and the breaker store), the production ``AgentInvoker`` (with the two bench no-op tools), and a
model served over real HTTP on loopback by ``bench.common``'s model server with 50 ms latency.

A run is 10 model steps: the leader's plan, 8 maker steps (7 calls of a no-op tool, then the
summary) and the verifier's verdict; every model step and tool result is persisted. The 200
runs are triggered in one transaction (a burst: their nudges go out when it commits) and the
clock runs from that commit to the last run's end. Figures: model steps per second, the longest
run (commit → ``finished_at``), and the worker's resident memory (peak ``VmHWM``).

A second phase holds 200 runs in flight in one worker (a 3 s model) and reports its RSS.
``python -m bench.throughput``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from bench import common

RUNS, STEPS = 200, 10
TARGET_RATE, STRETCH_RATE, TARGET_MAX_S, TARGET_RSS_MB, PEER_RATIO = 300.0, 400.0, 7.0, 300.0, 2.5
WORKERS = 2
TOOLS = [*common.NOOP_TOOLS, "read"]


def _trigger(pattern_key: str, runs: int, steps: int, tag: str) -> tuple[list[Any], float]:
    """Create ``runs`` runs in one transaction; returns their ids and the commit time."""
    from django.db import transaction

    from loops.models import LoopPattern
    from loops.services.runs import run_trigger

    pattern = LoopPattern.objects.get(key=pattern_key)
    with transaction.atomic():
        ids = [
            run_trigger(
                pattern=pattern,
                actor="bench",
                inputs=common.bench_goal_inputs(tag=f"{tag}-{n}", steps=steps),
            ).id
            for n in range(runs)
        ]
    return ids, time.time()


def _wait_done(ids: list[Any], timeout: float, on_tick: Any = None) -> None:
    from loops import state
    from loops.models import LoopRun

    terminal = [s.value for s in state.TERMINAL]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if on_tick is not None:
            on_tick()
        if LoopRun.objects.filter(pk__in=ids, status__in=terminal).count() == len(ids):
            return
        time.sleep(0.1)
    left = LoopRun.objects.filter(pk__in=ids).exclude(status__in=terminal)
    raise TimeoutError(f"{left.count()} runs unfinished, e.g. {list(left.values('status')[:3])}")


def _round_result(ids: list[Any], committed: float) -> dict[str, Any]:
    from loops.models import LoopRun, LoopStep

    rows = list(LoopRun.objects.filter(pk__in=ids).values("status", "finished_at"))
    bad = [r["status"] for r in rows if r["status"] != "succeeded"]
    if bad:
        raise RuntimeError(f"{len(bad)} runs did not succeed: {bad[:5]}")
    ends = [r["finished_at"].timestamp() for r in rows if r["finished_at"] is not None]
    model_steps = LoopStep.objects.filter(run_id__in=ids, kind="model").count()
    elapsed = max(ends) - committed
    return {
        "steps_per_s": model_steps / elapsed,
        "max_run_s": elapsed,
        "median_run_s": statistics.median(e - committed for e in ends),
        "model_steps": model_steps,
    }


def _throughput_phase(args: argparse.Namespace, logs: Any) -> dict[str, Any]:
    model = common.ModelServerProc(logs, latency=0.05).start()
    key = common.bench_team(model_url=model.url, maker_steps=STEPS, tools=TOOLS, prefix="tp")
    workers = [
        common.worker_proc(f"worker-{n}", common.service_env(), logs).start()
        for n in range(args.workers)
    ]
    for worker in workers:
        common.wait_for_worker(worker)
    _wait_done(_trigger(key, 4, args.steps - 3, "warm")[0], 120)  # warm every code path
    rounds, peak_rss = [], 0.0
    for repeat in range(args.repeats):
        ids, committed = _trigger(key, args.runs, args.steps - 3, f"r{repeat}")
        cpu = sum(w.cpu_seconds() for w in workers), model.proc.cpu_seconds()
        _wait_done(ids, 600)
        result = _round_result(ids, committed)
        worker_cpu = sum(w.cpu_seconds() for w in workers) - cpu[0]
        result["worker_cpu_ms_per_step"] = worker_cpu * 1000 / result["model_steps"]
        result["model_server_cpu_ms_per_step"] = (
            (model.proc.cpu_seconds() - cpu[1]) * 1000 / result["model_steps"]
        )
        rounds.append(result)
        peak_rss = max(peak_rss, *(w.memory_mb()["peak"] for w in workers))
    model_state = model.state()
    for worker in workers:
        worker.stop()
    model.stop()
    return {
        "rounds": rounds,
        "peak_rss_mb": peak_rss,
        "model_max_in_flight": model_state["max_in_flight"],
    }


def _in_flight_phase(args: argparse.Namespace, logs: Any) -> dict[str, Any]:
    """One worker holding ``args.runs`` runs at once (a slow model, 3 s, keeps them in
    flight; 0.5 s in smoke mode)."""
    from loops.models import LoopRun

    model = common.ModelServerProc(logs, latency=args.hold_latency).start()
    key = common.bench_team(model_url=model.url, maker_steps=2, tools=TOOLS, prefix="mem")
    worker = common.worker_proc("worker-mem", common.service_env(), logs).start()
    common.wait_for_worker(worker)
    idle = worker.memory_mb()["rss"]
    ids, _ = _trigger(key, args.runs, 2, "mem")
    held, rss = 0, 0.0

    def sample() -> None:
        nonlocal held, rss
        now = LoopRun.objects.filter(pk__in=ids, lease_owner__isnull=False).count()
        held = max(held, now)
        rss = max(rss, worker.memory_mb()["rss"])

    _wait_done(ids, 600, on_tick=sample)
    peak = worker.memory_mb()["peak"]
    worker.stop()
    model.stop()
    return {"idle_rss_mb": idle, "max_held": held, "rss_mb": rss, "peak_rss_mb": peak}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    logs = common.log_dir("throughput-child")
    out = {"throughput": _throughput_phase(args, logs), "load": common.load_average()}
    out["memory"] = _in_flight_phase(args, logs)
    return out


# --- in the bench runner ------------------------------------------------------------------------


def _peer_fields(ours: float, peer: dict[str, Any]) -> dict[str, Any]:
    rate = peer.get("steps_per_s")
    if rate is None:
        return {
            "reference": f"LangGraph + AsyncPostgresSaver: {peer.get('note', 'peer not installed')}"
        }
    return {
        "ratio": common.ratio(ours, rate),
        "reference": f"LangGraph + AsyncPostgresSaver, durability=sync, {rate:.1f} steps/s "
        f"({peer['processes']} processes as ours has {WORKERS} workers, same model server, "
        f"same run; longest run {peer['max_run_s']:.2f} s)",
        "reference_median": round(rate, 2),
    }


def run(smoke: bool = False) -> list[dict[str, Any]]:
    from bench import peer_langgraph

    if not common.redis_available():
        raise RuntimeError(f"Redis is needed at {common.BENCH_REDIS}")
    runs, repeats = (10, 1) if smoke else (RUNS, 3)
    logs = common.log_dir("throughput")
    with common.ScratchDatabase("throughput") as db:
        argv = ["--runs", str(runs), "--repeats", str(repeats), "--workers", str(WORKERS)]
        argv += ["--hold-latency", "0.5" if smoke else "3.0"]
        result = common.run_child("bench.throughput", db.env(), argv, 3600, logs)
    rounds = result["throughput"]["rounds"]
    rates = [r["steps_per_s"] for r in rounds]
    rate = statistics.median(rates)
    max_s = statistics.median(r["max_run_s"] for r in rounds)
    peer = peer_langgraph.throughput(smoke, processes=WORKERS)
    ratio_ok = peer.get("steps_per_s") is None or rate / peer["steps_per_s"] >= PEER_RATIO
    memory = result["memory"]
    return [
        common.row(
            f"throughput, {runs} runs x {STEPS} model steps, 50 ms model, {WORKERS} workers",
            f">= {TARGET_RATE:g} steps/s (stretch {STRETCH_RATE:g}); "
            f"vs LangGraph in {WORKERS} processes >= {PEER_RATIO:g}",
            median=rate,
            unit="steps/s",
            spread=common.spread(rates),
            passed=rate >= TARGET_RATE and ratio_ok,
            stretch_met=rate >= STRETCH_RATE,
            samples=[round(r, 1) for r in rates],
            worker_cpu_ms_per_step=round(
                statistics.median(r.get("worker_cpu_ms_per_step", 0) for r in rounds), 2
            ),
            model_server_cpu_ms_per_step=round(
                statistics.median(r.get("model_server_cpu_ms_per_step", 0) for r in rounds), 2
            ),
            peak_worker_rss_mb=round(result["throughput"]["peak_rss_mb"], 1),
            **_peer_fields(rate, peer),
        ),
        common.row(
            f"longest run of {runs} (burst commit -> finished)",
            f"<= {TARGET_MAX_S:g} s",
            median=max_s,
            unit="s",
            passed=max_s <= TARGET_MAX_S,
            samples=[round(r["max_run_s"], 2) for r in rounds],
            median_run_s=round(statistics.median(r["median_run_s"] for r in rounds), 2),
        ),
        common.row(
            f"worker RSS holding {memory['max_held']} in-flight runs",
            f"< {TARGET_RSS_MB:g} MB with {runs} in flight",
            median=memory["rss_mb"],
            unit="MB",
            passed=memory["rss_mb"] < TARGET_RSS_MB and memory["max_held"] >= runs,
            idle_rss_mb=round(memory["idle_rss_mb"], 1),
            peak_rss_mb=round(memory["peak_rss_mb"], 1),
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    child = sub.add_parser("child", help="(internal) measure in this process")
    child.add_argument("--out", required=True)
    child.add_argument("--runs", type=int, default=RUNS)
    child.add_argument("--steps", type=int, default=STEPS)
    child.add_argument("--repeats", type=int, default=3)
    child.add_argument("--workers", type=int, default=WORKERS)
    child.add_argument("--hold-latency", type=float, default=3.0)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "child":
        common.child_main(measure, args)
    else:
        for line in run(smoke=args.smoke):
            print(line)


if __name__ == "__main__":
    main(sys.argv[1:])

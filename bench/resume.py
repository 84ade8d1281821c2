"""Resume latency: the approval decision returns → the approved tool starts; and parked runs.

The real service on a scratch PostgreSQL database (web server, one idle worker, Redis db 10,
the loopback model server). A run's maker calls ``bench_noop``/``bench_peek`` a number of times
(its history), then ``write``, which the default harness gates: the run parks in
``waiting_approval`` and releases its lease. The bench approves through
``POST /api/v1/approvals/<id>/decide`` and takes the time when the response is back; the worker's
``write`` (the builtin schema, instrumented by ``bench.common``) writes ``time.monotonic()`` when it
starts. Between the two: the re-queue nudge (sent when the decision commits), the claim, loading
the run, replaying the invocation's journal, and running the approved call. Measured with a short
(2 prior steps), a long (50) and a very long (500) history, 30 approvals each (10 for 500),
three repeats that alternate them (the figures are medians over the repeats): the figure must
not depend on run length (the platform's step ceiling is raised for the 500-step runs, as
``LOOPWRIGHT_HARNESS_PLATFORM`` lets an operator do).

Then 500 runs are parked on approvals at once, and the worker's RSS and leases are read: a parked
run must cost no worker memory and hold no slot. ``python -m bench.resume``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench import common

TARGET_P50_MS, TARGET_P99_MS, LENGTH_LIMIT = 15.0, 30.0, 1.5
HISTORIES = (2, 50, 500)
#: Fewer approvals for the longest history (each of its runs takes 500 model steps to park).
LONGEST_SAMPLES = 10
PARKED = 500
TOOLS = [*common.NOOP_TOOLS, "read", "write"]


def _park(service: common.Service, count: int, history: int) -> list[str]:
    ids = [service.trigger(steps=history, gate=1)[0] for _ in range(count)]
    common.wait_status(ids, ["waiting_approval"], 120 + count * 2)
    return ids


def _approve(service: common.Service, run_id: str) -> tuple[float, dict[str, float]]:
    """Decide the run's pending approval; returns the latency to the tool's start in ms."""
    from loops import state
    from loops.models import ActionApproval

    approval = ActionApproval.objects.get(run_id=uuid.UUID(run_id), status="pending")
    mark = Path(service.mark_dir, f"{run_id}.start")
    response = service.http.post(f"/approvals/{approval.id}/decide", json={"decision": "approve"})
    returned = time.monotonic()
    if response.status_code != 200:
        raise RuntimeError(f"decide: {response.status_code} {response.text[:500]}")
    deadline = returned + 60
    while not mark.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"approved tool of {run_id} never started:\n{service.worker.log()}")
        time.sleep(0.001)
    started, started_wall = (float(v) for v in mark.read_text().split())
    common.wait_status([run_id], [s.value for s in state.TERMINAL], 60)
    return (started - returned) * 1000, _breakdown(run_id, started_wall)


def _breakdown(run_id: str, tool_wall: float) -> dict[str, float]:
    """Where the time went, from the run's events (wall clock, ms after the decision's
    ``approval.resumed`` event)."""
    from loops.models import LoopEvent

    events = LoopEvent.objects.filter(run_id=uuid.UUID(run_id)).order_by("seq")
    resumed = events.filter(type="approval.resumed").values_list("seq", "created_at").last()
    assert resumed is not None
    seq, at = resumed
    marks: dict[str, float] = {}
    for kind, when in events.filter(seq__gt=seq).values_list("type", "created_at"):
        if kind in ("lease.claimed", "run.started", "invocation.started"):
            marks.setdefault(kind, when.timestamp())
    marks["tool starts"] = tool_wall
    return {k: round((v - at.timestamp()) * 1000, 2) for k, v in marks.items()}


def _parked_cost(service: common.Service, count: int) -> dict[str, Any]:
    from loops.models import LoopRun

    before = service.worker.memory_mb()["rss"]
    ids = _park(service, count, 0)
    time.sleep(1.0)
    after = service.worker.memory_mb()["rss"]
    leased = LoopRun.objects.filter(pk__in=ids, lease_owner__isnull=False).count()
    return {"parked": len(ids), "rss_before_mb": before, "rss_after_mb": after, "leased": leased}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    service = common.Service("resume", prefix="rsm", maker_steps=max(HISTORIES), tools=TOOLS)
    out: dict[str, Any] = {"load": common.load_average(), "latencies_ms": {}}
    try:
        # Repeats alternate the histories, so a drift of the machine's speed meets both alike.
        for _ in range(args.repeats):
            for history in HISTORIES:
                samples = min(args.samples, LONGEST_SAMPLES) if history >= 500 else args.samples
                ids = _park(service, samples + args.warmup, history)
                results = [_approve(service, run_id) for run_id in ids][args.warmup :]
                out["latencies_ms"].setdefault(str(history), []).append([r[0] for r in results])
                out.setdefault("breakdowns", {}).setdefault(str(history), []).extend(
                    r[1] for r in results
                )
        out["parked"] = _parked_cost(service, args.parked)
    finally:
        service.close()
    return out


def _median_breakdown(breakdowns: list[dict[str, float]]) -> dict[str, float] | None:
    if not breakdowns:
        return None
    keys = [k for k in breakdowns[0] if all(k in b for b in breakdowns)]
    return {k: round(statistics.median(b[k] for b in breakdowns), 2) for k in keys}


def run(smoke: bool = False) -> list[dict[str, Any]]:
    from bench import peer_langgraph

    if not common.redis_available():
        raise RuntimeError(f"Redis is needed at {common.BENCH_REDIS}")
    samples, parked, repeats = (2, 20, 1) if smoke else (30, PARKED, 3)
    logs = common.log_dir("resume")
    with common.ScratchDatabase("resume") as db:
        argv = ["--samples", str(samples), "--warmup", "1" if smoke else "2"]
        argv += ["--parked", str(parked), "--repeats", str(repeats)]
        platform = json.dumps({"limits": {"recursionLimit": max(HISTORIES) + 20}})
        env = {**db.env(), "LOOPWRIGHT_HARNESS_PLATFORM": platform}
        result = common.run_child("bench.resume", env, argv, 3600, logs)
    # Per history, one list of latencies per repeat: the figures are medians over repeats.
    by_history = {int(h): v for h, v in result["latencies_ms"].items()}
    repeat_p50s = {h: [statistics.median(r) for r in v] for h, v in by_history.items()}
    p50 = {h: statistics.median(v) for h, v in repeat_p50s.items()}
    p99 = {h: statistics.median(common.percentile(r, 99) for r in v) for h, v in by_history.items()}
    short = HISTORIES[0]
    growth = {h: p50[h] / p50[short] if p50[short] > 0 else float("inf") for h in HISTORIES}
    rows = []
    for history in HISTORIES:
        peer = peer_langgraph.resume(history, smoke) if history <= 50 else {"note": "not run"}
        fields: dict[str, Any] = {"reference": f"LangGraph: {peer.get('note', '')}"}
        if peer.get("p50") is not None:
            fields = {
                "ratio": common.ratio(p50[history], peer["p50"]),
                "reference": "LangGraph + PostgresSaver (durability=sync) resume from a new "
                f"connection p50 "
                f"{peer['p50']:.1f} ms, p99 {peer['p99']:.1f} ms (same run)",
            }
        rows.append(
            common.row(
                f"resume: approval decided -> approved tool starts, {history} prior steps",
                f"p50 <= {TARGET_P50_MS:g} ms, p99 <= {TARGET_P99_MS:g} ms"
                + (f", <= {LENGTH_LIMIT:g} x the short run" if history != short else ""),
                median_ms=p50[history],
                p99_ms=round(p99[history], 3),
                spread=common.spread(repeat_p50s[history]),
                repeat_p50s=[round(v, 2) for v in repeat_p50s[history]],
                passed=p50[history] <= TARGET_P50_MS
                and p99[history] <= TARGET_P99_MS
                and growth[history] <= LENGTH_LIMIT,
                samples=sum(len(r) for r in by_history[history]),
                breakdown_ms_after_decision=_median_breakdown(
                    result.get("breakdowns", {}).get(str(history), [])
                ),
                growth_vs_short=round(growth[history], 3) if history != short else None,
                **fields,
            )
        )
    cost = result["parked"]
    delta = cost["rss_after_mb"] - cost["rss_before_mb"]
    rows.append(
        common.row(
            f"{cost['parked']} runs parked on approvals: worker RSS growth",
            "no worker memory or slots (0 leases; RSS growth < 20 MB)",
            median=delta,
            unit="MB",
            passed=cost["leased"] == 0 and delta < 20,
            leases_held=cost["leased"],
            rss_before_mb=round(cost["rss_before_mb"], 1),
            rss_after_mb=round(cost["rss_after_mb"], 1),
        )
    )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.resume", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    child = sub.add_parser("child", help="(internal) measure in this process")
    child.add_argument("--out", required=True)
    child.add_argument("--samples", type=int, default=30)
    child.add_argument("--warmup", type=int, default=2)
    child.add_argument("--parked", type=int, default=PARKED)
    child.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "child":
        common.child_main(measure, args)
    else:
        for line in run(smoke=args.smoke):
            print(line)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Retention under load: the engine's claims and steps while a prune runs (issue 28, target 2).

Runs on the database ``bench.volume`` has just filled (a year of copied finished runs; its
``run()`` calls :func:`run_on` after timing the pages), in a measuring child:

1. **Idle**: ``ROUNDS`` rounds of the engine's two figures, measured by their own benches' code:
   claims + completions per second (``bench.claims``: ``CLAIM_RUNS`` queued runs, 4 claimer
   processes claiming ``POLL_BATCH`` per transaction, audited: no double claim, none left) and
   the per-step overhead (``bench.step_overhead``: the real driver and journal, an instant model,
   ``STEP_RUNS`` runs of 20 maker steps; its p50).
2. **Pruning**: a separate process runs the real retention, the beat task's call
   ``events_prune(budget_seconds=60)``, sweep after sweep until nothing is due, with
   ``LOOPWRIGHT_EVENT_RETENTION_DAYS`` set so that the oldest ``PRUNE_RUNS`` ended runs (or more)
   are due. The same rounds are measured while it runs; a round counts only if the prune was
   still running when it ended (a row says so when none did). Then the prune is waited for.
3. **Idle again**: ``ROUNDS`` rounds more, so that the machine's drift (other tenants) meets the
   idle figure from both sides of the prune.

Rows: each figure while pruning over its idle figure (the median of the rounds before and after;
target <= 1.5 x: the claim rate's slowdown, the step p50's growth) and the prune's own time and
runs/s.
``python -m bench.volume_prune [--smoke]`` measures on the database ``DATABASE_URL`` names (one
``python -m bench.volume seed --runs N`` filled); ``python -m bench volume`` runs it in turn.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench import claims, common
from bench.step_overhead import StepInvoker, _repeat, _run_once, steps_pattern, timed_driver

PRUNE_RUNS, SMOKE_PRUNE_RUNS = 100_000, 1_000
CLAIM_RUNS, STEP_RUNS, STEPS, ROUNDS, WARMUP = 5_000, 10, 20, 3, 1
SMOKE_SIZES = {"claim_runs": 100, "step_runs": 2, "rounds": 1}
RATIO_LIMIT = 1.5
#: The beat task's budget per sweep (``loops.tasks.events_prune_task``).
SWEEP_BUDGET_SECONDS = 60.0
PRUNE_TIMEOUT_SECONDS = 3600


# --- the prune process --------------------------------------------------------------------------


def prune_main(args: argparse.Namespace) -> None:
    """Sweeps as the beat task makes them, back to back until nothing is due (a backlog the beat
    would spread over sweeps ``LOOPWRIGHT_EVENT_PRUNE_SECONDS`` apart); the report as JSON."""
    import django

    django.setup()
    from loops.services.retention import events_prune

    print("prune-started", flush=True)
    started = time.monotonic()
    runs = events = sweeps = 0
    while True:
        report = events_prune(budget_seconds=SWEEP_BUDGET_SECONDS)
        runs, events, sweeps = runs + report.runs, events + report.events, sweeps + 1
        if not report.more:
            break
    seconds = time.monotonic() - started
    out = {"runs": runs, "events": events, "sweeps": sweeps, "seconds": seconds}
    Path(args.out).write_text(json.dumps(out))


# --- inside the measuring child ------------------------------------------------------------------


def _cutoff_days(prune_runs: int) -> tuple[float, int]:
    """Retention days that make the oldest ``prune_runs`` prunable runs due (the retention's
    own conditions), and how many are due with them now."""
    from django.db.models import Q
    from django.utils import timezone

    from loops import state
    from loops.models import LoopRun
    from loops.services.spans import SWEEP_WINDOW

    now = timezone.now()
    prunable = LoopRun.objects.filter(
        status__in=[s.value for s in state.TERMINAL],
        events_pruned_at__isnull=True,
        finished_at__isnull=False,
    ).filter(Q(span_record__isnull=False) | Q(created_at__lt=now - SWEEP_WINDOW))
    ordered = prunable.order_by("finished_at").values_list("finished_at", flat=True)
    found = list(ordered[prune_runs - 1 : prune_runs])
    if not found:
        raise RuntimeError(f"fewer than {prune_runs:,} ended runs to prune: seed more")
    last = found[0]
    # A prune that starts later moves its bound later too: these runs stay due.
    days = (now - last).total_seconds() / 86400
    return days, prunable.filter(finished_at__lte=last).count()


def _claims_round(runs: int) -> float:
    """``bench.claims``' workload on this database: queued runs, 4 audited claimers."""
    import psycopg

    url = os.environ["DATABASE_URL"]
    audit = f"{claims.AUDIT_TABLE} (run_id text, owner text, token bigint)"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {audit}")
        conn.execute(f"TRUNCATE {claims.AUDIT_TABLE}")
    claims.seed_runs(runs)
    result = claims.run_claimers("ours", claims.PROCESSES, {}, audit=True, batch=claims.POLL_BATCH)
    with psycopg.connect(url, autocommit=True) as conn:
        problems = claims.audit_problems(conn, runs)
    if result["done"] != runs or problems != {"double_claims": 0, "unclaimed": 0}:
        raise AssertionError(f"claims: {result['done']} of {runs} completed, {problems}")
    return float(result["rate"])


def _steps_pattern() -> Any:
    from loops.models import LoopPattern

    found = LoopPattern.objects.filter(key="bench-steps").first()
    return found or steps_pattern("bench-steps")


def _steps_round(pattern: Any, runs: int) -> dict[str, Any]:
    """``bench.step_overhead``'s repeat: ``runs`` runs of ``STEPS`` maker steps, one at a time,
    through a driver of their own (stopped after: it would claim the claims' queued runs)."""
    invoker = StepInvoker()
    driver = timed_driver(invoker=invoker, capacity=8, owner=f"bench-prune-{uuid.uuid4().hex[:6]}")
    driver.start()
    try:
        for _ in range(WARMUP):
            _run_once(driver, invoker, pattern, STEPS)
        return dict(_repeat(driver, invoker, pattern, STEPS, runs))
    finally:
        driver.stop(drain_seconds=5)


def _pruned_so_far() -> int:
    from loops.models import LoopRun

    return LoopRun.objects.filter(events_pruned_at__isnull=False).count()


def _rounds(args: argparse.Namespace, pattern: Any, prune: common.Proc | None) -> list[Any]:
    out = []
    for _ in range(args.rounds):
        steps = _steps_round(pattern, args.step_runs)  # first: no process to start
        rate = _claims_round(args.claim_runs)
        alive = prune is not None and prune.alive()
        out.append({"claims_rate": rate, "step_p50": steps["p50"], "pruning_at_end": alive})
        if prune is not None and not alive:
            break  # the prune is over: another round would be idle again
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    days, due = _cutoff_days(args.prune_runs)
    pattern = _steps_pattern()
    idle = _rounds(args, pattern, None)
    logs = Path(args.out).parent
    report = logs / f"prune-{uuid.uuid4().hex[:6]}.json"
    argv = [sys.executable, "-m", "bench.volume_prune", "prune", "--out", str(report)]
    env = {"LOOPWRIGHT_EVENT_RETENTION_DAYS": repr(days)}
    prune = common.Proc("prune", argv, env, logs).start()
    try:
        prune.wait_for_log("prune-started", 120)
        pruning = _rounds(args, pattern, prune)
        pruned_by_then = _pruned_so_far()
        assert prune.proc is not None
        prune.proc.wait(timeout=PRUNE_TIMEOUT_SECONDS)
    finally:
        prune.stop()
    if prune.proc.returncode != 0 or not report.exists():
        raise RuntimeError(f"the prune failed ({prune.proc.returncode}):\n{prune.log()}")
    return {
        "days": days,
        "due": due,
        "idle": idle,
        # Idle again once the prune is over: the machine's drift meets both sides alike.
        "idle_after": _rounds(args, pattern, None),
        "pruning": pruning,
        "pruned_by_measurement_end": pruned_by_then,
        "prune": json.loads(report.read_text()),
        "load": common.load_average(),
    }


# --- in the bench runner --------------------------------------------------------------------------


def _ratio_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    before, after = result["idle"], result.get("idle_after", [])
    idle, during = [*before, *after], [r for r in result["pruning"] if r["pruning_at_end"]]
    note = None
    if not during:  # the prune ended first: what was measured is not "under load"
        during = result["pruning"]
        note = "the prune ended before the measurement did: not measured under load"
    prune = result["prune"]
    context = {
        "rounds": f"{len(before)} idle before, {len(during)} while pruning, {len(after)} after",
        "pruned_by_measurement_end": f"{result['pruned_by_measurement_end']:,} of "
        f"{prune['runs']:,} runs",
        "note": note,
    }
    rows = []
    for key, label, unit, slower in (
        ("claims_rate", "claims+completions/s", "/s", lambda i, p: i / p),
        ("step_p50", "per-step overhead p50, 20-step runs", "ms", lambda i, p: p / i),
    ):
        idle_values = [r[key] for r in idle]
        values = [r[key] for r in during]
        ours, reference = statistics.median(values), statistics.median(idle_values)
        ratio = slower(reference, ours)
        value = {"median_ms": ours} if unit == "ms" else {"median": ours, "unit": unit}
        figure = f"volume prune: {label} while {prune['runs']:,} runs' events are pruned / idle"
        rows.append(
            common.row(
                figure + (" (NOT under load: the prune ended first)" if note else ""),
                f"<= {RATIO_LIMIT:g} x",
                passed=ratio <= RATIO_LIMIT and note is None,
                spread=common.spread(values),
                ratio=round(ratio, 3),
                reference=f"idle {reference:.3g} {unit} (before and after), same database",
                samples={
                    "idle_before": [r[key] for r in before],
                    "pruning": values,
                    "idle_after": [r[key] for r in after],
                },
                **value,
                **context,
            )
        )
    return rows


def rows_from(result: dict[str, Any]) -> list[dict[str, Any]]:
    prune = result["prune"]
    rate = prune["runs"] / prune["seconds"] if prune["seconds"] else 0.0
    return [
        *_ratio_rows(result),
        common.row(
            f"volume prune: {prune['runs']:,} runs' events pruned ({prune['events']:,} events)",
            f"every due run pruned (>= {result['due']:,})",
            median=rate,
            unit="runs/s",
            passed=prune["runs"] >= result["due"],
            seconds=round(prune["seconds"], 1),
            sweeps=prune["sweeps"],
            retention_days=round(result["days"], 2),
        ),
    ]


def run_on(env: dict[str, str], logs: Path, smoke: bool = False) -> list[dict[str, Any]]:
    """Measure on the database of ``env`` (a filled one), in a child; the rows."""
    sizes = dict(SMOKE_SIZES) if smoke else {"claim_runs": CLAIM_RUNS, "step_runs": STEP_RUNS}
    sizes.setdefault("rounds", ROUNDS)
    sizes["prune_runs"] = SMOKE_PRUNE_RUNS if smoke else PRUNE_RUNS
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in sizes.items()]
    timeout = PRUNE_TIMEOUT_SECONDS + 1800
    return rows_from(common.run_child("bench.volume_prune", env, argv, timeout, logs))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.volume_prune", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    child = sub.add_parser("child", help="(internal) measure in this process")
    child.add_argument("--out", required=True)
    for name, default in (("claim-runs", CLAIM_RUNS), ("step-runs", STEP_RUNS)):
        child.add_argument(f"--{name}", type=int, default=default)
    child.add_argument("--rounds", type=int, default=ROUNDS)
    child.add_argument("--prune-runs", type=int, default=PRUNE_RUNS)
    pruner = sub.add_parser("prune", help="(internal) the prune, as the beat task runs it")
    pruner.add_argument("--out", required=True)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "child":
        common.child_main(measure, args)
    elif args.command == "prune":
        prune_main(args)
    else:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
        env = {
            "LOOPWRIGHT_VAR_DIR": str(common.scratch_root() / "var"),
            "CELERY_BROKER_URL": "memory://",
            "LOG_LEVEL": "WARNING",
        }
        for line in run_on(env, common.log_dir("volume-prune"), smoke=args.smoke):
            print(line)


if __name__ == "__main__":
    main(sys.argv[1:])

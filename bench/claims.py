"""Claim throughput: runs claimed and completed per second by 4 worker processes on PostgreSQL.

Two workloads on the same server, in a scratch database ``lw_bench_claims`` (the prefix is
``LOOPWRIGHT_BENCH_DB_PREFIX``) that this command creates, migrates and drops (it never touches
another database):

- **ours**: each process loops as a worker's driver does with a backlog (its poll claims
  ``POLL_BATCH`` runs per transaction, ``docs/worker.md``): ``run_claim(limit=POLL_BATCH)``
  (SKIP LOCKED claim with lease, fencing token and ``lease.claimed`` event per run; a run that
  needs no preparation, as these, is started by the claim too: ``running`` with its
  ``run.started`` event), then completes each run on its own through the engine's only status
  function: ``run_transition`` to ``succeeded`` (to ``running`` first for a run the claim left
  ``preparing``), fenced by the lease and writing its event. Every claim is audited, and the
  audit must show 0 double claims and 0 runs left unclaimed.
- **raw**: the reference, a bare ``UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED LIMIT
  n) RETURNING`` claim of the same batch size plus a token-guarded completion ``UPDATE`` per
  job on a scratch table; and the same loop one job at a time (the issue's 1,800/s figure).

Each workload is repeated (>= 3 times); the median and the spread (max - min) are reported, and
``ratio`` is ours / raw. Run it with ``python -m bench.claims`` (``--smoke`` for tiny numbers);
``DATABASE_URL`` picks the server (default ``postgres://postgres@127.0.0.1:5432/``).

The same claimer (``python -m bench.claims worker ...``) drives the D2 concurrency test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = os.environ.get("LOOPWRIGHT_BENCH_DB_PREFIX", "lw_bench_") + "claims"
PROCESSES = 4
TARGET = 1000.0
#: A worker's driver claims this many per transaction when work waits (its poll's batch);
#: kept equal to ``loops.worker.driver.POLL_BATCH`` by a test.
POLL_BATCH = 10
AUDIT_TABLE = "lw_claim_audit"
RAW_TABLE = "bench_raw_queue"
# Plain literals (the table names above are constants): the raw reference workload.
AUDIT_INSERT = "INSERT INTO lw_claim_audit (run_id, owner, token) VALUES (%s, %s, %s)"
RAW_CLAIM = (
    "UPDATE bench_raw_queue SET status = 'running', owner = %s, token = token + 1 "
    "WHERE id IN (SELECT id FROM bench_raw_queue WHERE status = 'queued' ORDER BY id LIMIT %s "
    "FOR UPDATE SKIP LOCKED) RETURNING id, token"
)
#: One job per claim: the classic form (``=`` on a one-row subquery), the issue's reference.
RAW_CLAIM_ONE = (
    "UPDATE bench_raw_queue SET status = 'running', owner = %s, token = token + 1 "
    "WHERE id = (SELECT id FROM bench_raw_queue WHERE status = 'queued' ORDER BY id LIMIT 1 "
    "FOR UPDATE SKIP LOCKED) RETURNING id, token"
)
RAW_COMPLETE = (
    "UPDATE bench_raw_queue SET status = 'succeeded' WHERE id = %s AND owner = %s AND token = %s"
)
RAW_ANY_QUEUED = "SELECT 1 FROM bench_raw_queue WHERE status = 'queued' LIMIT 1"


# --- the claimer processes --------------------------------------------------------------------


def _wait_for_go(ready: Path, go: Path) -> float:
    ready.touch()
    while not go.exists():
        time.sleep(0.002)
    return time.time()


def _audit_sql(count: int) -> str:
    """One audit statement for a claimed batch (both workloads write it the same way)."""
    return AUDIT_INSERT + ", (%s, %s, %s)" * (count - 1)


def _ours_loop(owner: str, audit: bool, batch: int) -> int:
    from django.db import connection

    from loops.models import LoopRun, RunStatus
    from loops.services.claims import run_claim
    from loops.services.endings import run_transition

    done = 0
    while True:
        # The claim is its own transaction, as the engine makes it; the audit rows follow it
        # in their own statement, as in the raw loop (no claimer crashes here between the two).
        claims = run_claim(owner=owner, lease_seconds=60, limit=batch)
        if claims and audit:
            with connection.cursor() as cursor:
                rows = [(str(c.lease.run_id), owner, c.lease.token) for c in claims]
                cursor.execute(_audit_sql(len(rows)), [v for row in rows for v in row])
        if not claims:
            if not LoopRun.objects.filter(status=RunStatus.QUEUED).exists():
                return done
            continue  # the rest is locked by other claimers right now
        for claim in claims:
            lease = claim.lease
            # A run that needs no preparation comes back started (running) from its claim.
            targets = [RunStatus.SUCCEEDED]
            if claim.status == RunStatus.PREPARING:
                targets.insert(0, RunStatus.RUNNING)
            for target in targets:
                run_transition(run_id=lease.run_id, to=target, actor=owner, lease=lease)
            done += 1


def _raw_loop(owner: str, audit: bool, batch: int) -> int:
    import psycopg

    done = 0
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        while True:
            if batch == 1:
                rows = conn.execute(RAW_CLAIM_ONE, [owner]).fetchall()
            else:
                rows = conn.execute(RAW_CLAIM, [owner, batch]).fetchall()
            if not rows:
                left = conn.execute(RAW_ANY_QUEUED)
                if left.fetchone() is None:
                    return done
                continue
            if audit:
                conn.execute(
                    _audit_sql(len(rows)), [v for r in rows for v in (str(r[0]), owner, r[1])]
                )
            for job, token in rows:
                conn.execute(RAW_COMPLETE, [job, owner, token])
                done += 1


def worker_main(args: argparse.Namespace) -> None:
    if args.mode == "ours":
        import django

        django.setup()
        from django.db import connection

        connection.ensure_connection()
    started = _wait_for_go(Path(args.ready), Path(args.go))
    cpu = time.process_time()
    loop = _ours_loop if args.mode == "ours" else _raw_loop
    done = loop(args.owner, args.audit, args.batch)
    cpu = time.process_time() - cpu  # the loop's own CPU (Django's start excluded)
    print(json.dumps({"owner": args.owner, "done": done, "started": started, "end": time.time(),
                      "cpu": cpu}))  # fmt: skip


def run_claimers(
    mode: str,
    processes: int,
    env: dict[str, str],
    audit: bool,
    timeout: float = 600,
    batch: int = 1,
) -> dict[str, Any]:
    """Start ``processes`` claimers (each claiming up to ``batch`` runs per transaction),
    release them at once, wait; returns counts and the rate."""
    with tempfile.TemporaryDirectory(prefix="lw-claimers-") as tmp:
        go = Path(tmp) / "go"
        procs = []
        for n in range(processes):
            argv = [
                sys.executable, "-m", "bench.claims", "worker", "--mode", mode,
                "--owner", f"claimer-{n}-{uuid.uuid4().hex[:6]}", "--ready", f"{tmp}/ready-{n}",
                "--go", str(go), "--batch", str(batch), *(["--audit"] if audit else []),
            ]  # fmt: skip
            procs.append(
                subprocess.Popen(
                    argv, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE,
                    start_new_session=True, text=True,
                )
            )  # fmt: skip
        try:
            return _release_and_collect(procs, Path(tmp), go, timeout)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, 9)
                    proc.wait()


def _release_and_collect(
    procs: list[subprocess.Popen[str]], tmp: Path, go: Path, timeout: float
) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while len(list(tmp.glob("ready-*"))) < len(procs):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError("claimers did not get ready")
        time.sleep(0.02)
    go_at = time.time()
    go.touch()
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"claimer failed with {proc.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    elapsed = max(r["end"] for r in results) - go_at
    done = sum(r["done"] for r in results)
    cpu_ms = sum(r["cpu"] for r in results) * 1000 / max(done, 1)
    return {
        "done": done, "seconds": elapsed, "rate": done / elapsed, "per_worker": results,
        "client_cpu_ms_per_run": cpu_ms,
    }  # fmt: skip


# --- the scratch database ----------------------------------------------------------------------


def _server_url() -> str:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        url = "postgres://postgres@127.0.0.1:5432/"
    return url


def _db_url(dbname: str) -> str:
    parts = urlsplit(_server_url())
    return urlunsplit((parts.scheme, parts.netloc, f"/{dbname}", "", ""))


def _admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(_db_url("postgres"), autocommit=True) as conn:
        conn.execute(sql)


def _child_env(var_dir: str) -> dict[str, str]:
    return {
        "DATABASE_URL": _db_url(BENCH_DB),
        "LOOPWRIGHT_VAR_DIR": var_dir,
        "CELERY_BROKER_URL": "memory://",
        "DJANGO_SETTINGS_MODULE": "orchestrator.settings",
    }


def _django(env: dict[str, str], *argv: str) -> None:
    result = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env={**os.environ, **env}, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"{argv} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")


def seed_runs(count: int) -> None:
    """Queued runs of one pattern, created the way tests do (Django must be set up)."""
    from loops.models import LoopPattern, LoopRun

    pattern, _ = LoopPattern.objects.get_or_create(
        key="bench",
        defaults={
            "goal_template": "bench",
            "leader_username": "leader",
            "maker_usernames": ["maker"],
            "verifier_username": "verifier",
        },
    )
    bindings = {"leader": "leader", "makers": ["maker"], "verifier": "verifier"}
    LoopRun.objects.bulk_create(
        [LoopRun(pattern=pattern, goal="bench", role_bindings=bindings) for _ in range(count)],
        batch_size=2000,
    )


def _prepare_ours(env: dict[str, str], runs: int) -> None:
    import psycopg

    with psycopg.connect(_db_url(BENCH_DB), autocommit=True) as conn:
        conn.execute("TRUNCATE loops_looprun, loops_looppattern CASCADE")
        conn.execute(f"TRUNCATE {AUDIT_TABLE}")
    _django(env, "-m", "bench.claims", "seed", "--runs", str(runs))
    with psycopg.connect(_db_url(BENCH_DB), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE loops_looprun")


def _prepare_raw(runs: int) -> None:
    import psycopg

    with psycopg.connect(_db_url(BENCH_DB), autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {RAW_TABLE}")
        conn.execute(
            f"CREATE TABLE {RAW_TABLE} (id bigserial PRIMARY KEY, status text NOT NULL, "
            "owner text, token bigint NOT NULL DEFAULT 0, payload jsonb NOT NULL DEFAULT '{}')"
        )
        conn.execute(f"CREATE INDEX ON {RAW_TABLE} (id) WHERE status = 'queued'")
        conn.execute(
            "INSERT INTO bench_raw_queue (status) SELECT 'queued' FROM generate_series(1, %s)",
            [runs],
        )
        conn.execute(f"TRUNCATE {AUDIT_TABLE}")
        conn.execute(f"VACUUM ANALYZE {RAW_TABLE}")


def audit_problems(conn: Any, expected: int) -> dict[str, int]:
    """Double claims and runs never claimed, from the audit table (0 and 0 when correct)."""
    double = conn.execute(
        "SELECT count(*) FROM (SELECT run_id FROM lw_claim_audit GROUP BY run_id "
        "HAVING count(*) > 1) d"
    ).fetchone()[0]
    distinct = conn.execute("SELECT count(DISTINCT run_id) FROM lw_claim_audit").fetchone()[0]
    return {"double_claims": int(double), "unclaimed": expected - int(distinct)}


FINISHED = {
    "ours": "SELECT count(*) FROM loops_looprun WHERE status = 'succeeded'",
    "raw": "SELECT count(*) FROM bench_raw_queue WHERE status = 'succeeded'",
}


def _check(mode: str, runs: int) -> None:
    import psycopg

    with psycopg.connect(_db_url(BENCH_DB), autocommit=True) as conn:
        problems = audit_problems(conn, runs)
        finished = conn.execute(FINISHED[mode]).fetchone()[0]
    if problems != {"double_claims": 0, "unclaimed": 0} or finished != runs:
        raise AssertionError(f"{mode}: {problems}, {finished}/{runs} finished")


def _measure(mode: str, env: dict[str, str], runs: int, batch: int) -> tuple[float, float]:
    """The rate of claims and completions, and the claimers' CPU (ms) per run."""
    if mode == "ours":
        _prepare_ours(env, runs)
    else:
        _prepare_raw(runs)
    result = run_claimers(mode, PROCESSES, env, audit=True, batch=batch)
    if result["done"] != runs:
        raise AssertionError(f"{mode}: {result['done']} of {runs} runs completed")
    _check(mode, runs)
    return float(result["rate"]), float(result["client_cpu_ms_per_run"])


def _summary(rates: list[float]) -> tuple[float, float]:
    return statistics.median(rates), max(rates) - min(rates)


#: The workloads: ours and the raw loop claim as many per transaction as a driver's poll
#: does with a backlog; the raw loop one at a time is the issue's reference figure.
WORKLOADS = {"ours": ("ours", POLL_BATCH), "raw": ("raw", POLL_BATCH), "raw_one": ("raw", 1)}


def run(smoke: bool = False) -> list[dict[str, Any]]:
    """Create the scratch database, measure the workloads (>= 3 repeats each), drop it."""
    runs, repeats = (100, 1) if smoke else (5000, 3)
    var_dir = tempfile.mkdtemp(prefix="lw-bench-var-")
    env = _child_env(var_dir)
    _admin(f'DROP DATABASE IF EXISTS "{BENCH_DB}"')
    _admin(f'CREATE DATABASE "{BENCH_DB}"')
    try:
        _django(env, "manage.py", "migrate", "--noinput", "-v", "0")
        _admin_bench(f"CREATE TABLE {AUDIT_TABLE} (run_id text, owner text, token bigint)")
        rates: dict[str, list[float]] = {name: [] for name in WORKLOADS}
        cpu: dict[str, list[float]] = {name: [] for name in WORKLOADS}
        for _ in range(repeats):
            for name, (mode, batch) in WORKLOADS.items():  # interleaved: drift hits all alike
                rate, cpu_ms = _measure(mode, env, runs, batch)
                rates[name].append(rate)
                cpu[name].append(cpu_ms)
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')
    ours, ours_spread = _summary(rates["ours"])
    raw, raw_spread = _summary(rates["raw"])
    raw_one, raw_one_spread = _summary(rates["raw_one"])
    return [
        {
            "figure": f"claims+completions/s, {PROCESSES} worker processes (PostgreSQL)",
            "target": f">= {TARGET:.0f}/s",
            "median": round(ours, 1),
            "spread": round(ours_spread, 1),
            "unit": "/s",
            "passed": ours >= TARGET,
            "ratio": round(ours / raw, 3),
            "reference": f"raw SKIP LOCKED loop, {POLL_BATCH} per claim",
            "reference_median": round(raw, 1),
            "reference_spread": round(raw_spread, 1),
            "raw_one_at_a_time": round(raw_one, 1),
            "raw_one_at_a_time_spread": round(raw_one_spread, 1),
            "batch": POLL_BATCH,
            # Where the gap is: the claimers' own CPU per run (the server's is not in it).
            "client_cpu_ms_per_run": {
                name: round(statistics.median(values), 3) for name, values in cpu.items()
            },
            "runs": runs,
            "repeats": repeats,
            "samples": {name: [round(r, 1) for r in values] for name, values in rates.items()},
            "load": round(os.getloadavg()[0], 1),
        }
    ]


def _admin_bench(sql: str) -> None:
    import psycopg

    with psycopg.connect(_db_url(BENCH_DB), autocommit=True) as conn:
        conn.execute(sql)


def _print_table(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        print(f"{row['figure']}  ({row['runs']} runs, {row['repeats']} repeats)")
        print(f"  ours: median {row['median']:>8.1f}{row['unit']}  spread {row['spread']:.1f}")
        print(
            f"  raw : median {row['reference_median']:>8.1f}{row['unit']}  "
            f"spread {row['reference_spread']:.1f}   ({row['reference']})"
        )
        print(
            f"  raw1: median {row['raw_one_at_a_time']:>8.1f}{row['unit']}  "
            f"spread {row['raw_one_at_a_time_spread']:.1f}   (the same, one job per claim)"
        )
        print(f"  ratio ours/raw {row['ratio']:.3f}; target {row['target']}: "
              f"{'PASS' if row['passed'] else 'FAIL'}")  # fmt: skip
        print(f"  claimers' CPU per run (ms): {row['client_cpu_ms_per_run']}")
        print(f"  samples: {row['samples']}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    worker = sub.add_parser("worker", help="(internal) one claimer process")
    worker.add_argument("--mode", choices=["ours", "raw"], required=True)
    worker.add_argument("--owner", required=True)
    worker.add_argument("--ready", required=True)
    worker.add_argument("--go", required=True)
    worker.add_argument("--audit", action="store_true")
    worker.add_argument("--batch", type=int, default=1, help="runs claimed per transaction")
    seed = sub.add_parser("seed", help="(internal) create queued runs")
    seed.add_argument("--runs", type=int, required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny numbers: just check it works")
    args = parser.parse_args(argv)
    if args.command == "worker":
        worker_main(args)
    elif args.command == "seed":
        import django

        django.setup()
        seed_runs(args.runs)
    else:
        _print_table(run(smoke=args.smoke))


if __name__ == "__main__":
    main()

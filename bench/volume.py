"""A year of history: the API and the UI with 200,000 finished runs (issue 28, target 2).

The service (``bench.common.Service``: uvicorn, one worker with the bench invoker, the loopback
model server) on a scratch PostgreSQL database. First the **templates**: ``TEMPLATES`` real runs
of 8 maker tool steps driven to ``succeeded`` through the engine, and ``PARKED`` runs parked on
an approval of their gated ``write`` (the approvals queue). Each page is timed (p50 of
``SAMPLES`` after a warm-up) on that small database. Then :func:`seed` copies the templates,
row for row, into ``RUNS`` finished runs spread over the past year (their events, steps and
usage buckets with them: a faithful bulk copy of what the engine wrote, new ids, shifted times),
``VACUUM ANALYZE``, and every page is timed again. Target: each within 2x of its small-database
figure.

The pages: the runs list (API, a pattern and a status, 20 a page), a run's detail and its
events page (API), the monitor and the metrics page (UI, a logged-in session), the approvals
queue (API). ``python -m bench.volume [--smoke]``; ``python -m bench.volume seed --runs N``
copies into the database ``DATABASE_URL`` names (for trying pages by hand).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from typing import Any

from bench import common, volume_prune

RUNS, SMOKE_RUNS = 200_000, 2_000
#: The issue's year holds 10 M events; a run of these templates writes 8, so each copy carries
#: its trail as many times as that takes (padding: the table's size, not a run's page, is
#: what the figure tests; a run's own pages are timed on a template, never padded).
EVENTS = 10_000_000
TEMPLATES, PARKED = 10, 20
SMOKE_TEMPLATES, SMOKE_PARKED = 2, 2
SAMPLES, WARMUP = 30, 5
RATIO_LIMIT = 2.0
TOOLS = [*common.NOOP_TOOLS, "read", "write"]

#: One statement per table (three for the usage buckets); ``%(runs)s`` copies, round-robin over
#: the template runs. The usage buckets as the write paths leave them (docs/runs.md, Budgets):
#: each copy's ``run:<id>`` rows are its template's, and their amounts are added to the copy's
#: pattern day (``pattern:<pattern id>:<UTC day the copy started>``; a template run lasts
#: seconds, so all of its charges fall on one day), whose ``<metric>:max_call`` rows keep the
#: largest model call.
#: Each copy carries its template's event trail ``%(trails)s`` times (one ``run.created``, seqs
#: after).
_COPY_RUNS = """
CREATE TEMP TABLE volume_map AS
SELECT gen_random_uuid() AS id, t.id AS template, n,
       now() - make_interval(secs => 365 * 86400.0 * n / %(runs)s) AS born
FROM generate_series(1, %(runs)s) AS n
JOIN (SELECT id, row_number() OVER (ORDER BY id) - 1 AS k FROM loops_looprun
      WHERE id = ANY(%(templates)s)) t ON t.k = n %% %(count)s;
INSERT INTO loops_looprun (id, pattern_id, pattern_version, status, trigger_type, triggered_by,
  trigger_ref, inputs, goal, autonomy_level, role_bindings, harness_snapshots, policy_snapshot,
  repository_snapshot, cursor, result, terminal_reason, failure_reason, attempts, max_attempts,
  lease_owner, lease_token, lease_expires_at, heartbeat_at, not_before, event_seq, step_count,
  wait, trace_id, instruction_versions, retry_of_id, model_call_token, created_at, started_at,
  finished_at, updated_at, events_pruned_at)
SELECT m.id, r.pattern_id, r.pattern_version, r.status, r.trigger_type, r.triggered_by,
  r.trigger_ref, r.inputs, r.goal, r.autonomy_level, r.role_bindings, r.harness_snapshots,
  r.policy_snapshot, r.repository_snapshot, r.cursor, r.result, r.terminal_reason,
  r.failure_reason, r.attempts, r.max_attempts, NULL, r.lease_token, NULL, NULL, NULL,
  r.event_seq * %(trails)s, r.step_count, r.wait, md5(m.id::text), r.instruction_versions, NULL,
  r.model_call_token, m.born,
  m.born + (r.started_at - r.created_at), m.born + (r.finished_at - r.created_at),
  m.born + (r.updated_at - r.created_at), NULL
FROM volume_map m JOIN loops_looprun r ON r.id = m.template;
INSERT INTO loops_loopstep (run_id, seq, role, invocation, kind, status, name, idempotency_key,
  request, response, error, tokens_in, tokens_out, cost, lease_token, call_hash, duration_ms,
  started_at, finished_at)
SELECT m.id, s.seq, s.role, s.invocation, s.kind, s.status, s.name,
  CASE WHEN s.idempotency_key IS NULL THEN NULL ELSE m.id::text || ':' || s.seq END,
  s.request, s.response, s.error, s.tokens_in, s.tokens_out, s.cost, s.lease_token, s.call_hash,
  s.duration_ms,
  m.born + (s.started_at - r.created_at), m.born + (s.finished_at - r.created_at)
FROM volume_map m JOIN loops_looprun r ON r.id = m.template JOIN loops_loopstep s
  ON s.run_id = m.template;
INSERT INTO loops_loopevent (run_id, seq, type, from_status, to_status, actor, data, created_at)
SELECT m.id, e.seq + k * r.event_seq, e.type, e.from_status, e.to_status, e.actor, e.data,
  m.born + (e.created_at - r.created_at)
FROM volume_map m JOIN loops_looprun r ON r.id = m.template JOIN loops_loopevent e
  ON e.run_id = m.template CROSS JOIN generate_series(0, %(trails)s - 1) AS k
WHERE k = 0 OR e.type <> 'run.created';
INSERT INTO loops_usagebucket (scope, metric, value, updated_at)
SELECT 'run:' || m.id::text, b.metric, b.value, now()
FROM volume_map m JOIN loops_usagebucket b ON b.scope = 'run:' || m.template::text;
INSERT INTO loops_usagebucket (scope, metric, value, updated_at)
SELECT 'pattern:' || r.pattern_id || ':'
    || ((m.born + (COALESCE(r.started_at, r.created_at) - r.created_at)) AT TIME ZONE 'UTC')::date,
  b.metric, SUM(b.value), now()
FROM volume_map m JOIN loops_looprun r ON r.id = m.template
  JOIN loops_usagebucket b ON b.scope = 'run:' || m.template::text
GROUP BY 1, 2
ON CONFLICT (scope, metric) DO UPDATE SET value = loops_usagebucket.value + excluded.value,
  updated_at = excluded.updated_at;
INSERT INTO loops_usagebucket (scope, metric, value, updated_at)
SELECT 'pattern:' || r.pattern_id || ':'
    || ((m.born + (COALESCE(r.started_at, r.created_at) - r.created_at)) AT TIME ZONE 'UTC')::date,
  c.metric || ':max_call', MAX(c.value), now()
FROM volume_map m JOIN loops_looprun r ON r.id = m.template
  JOIN (SELECT s.run_id, x.metric, MAX(x.value) AS value FROM loops_loopstep s
        CROSS JOIN LATERAL (VALUES ('tokens', (s.tokens_in + s.tokens_out)::numeric),
                                   ('cost', s.cost)) AS x (metric, value)
        WHERE s.run_id = ANY(%(templates)s) AND s.kind = 'model' AND x.value > 0
        GROUP BY s.run_id, x.metric) c ON c.run_id = m.template
GROUP BY 1, 2
ON CONFLICT (scope, metric) DO UPDATE SET value = GREATEST(loops_usagebucket.value,
  excluded.value), updated_at = excluded.updated_at;
DROP TABLE volume_map;
"""


def seed(runs: int, template_ids: list[Any], events: int = 0) -> dict[str, int]:
    """Copy the template runs (with their steps, events and usage buckets) into ``runs``
    finished runs spread over the past year, with at least ``events`` events in all (each
    copy's trail repeated); returns the row counts after and ``trails``. Django set up,
    PostgreSQL."""
    from django.db import connection

    from loops.models import LoopEvent

    per_run = LoopEvent.objects.filter(run_id__in=template_ids).count() / len(template_ids)
    trails = max(1, math.ceil(events / (runs * per_run))) if events and per_run else 1
    with connection.cursor() as cursor:
        params = {"runs": runs, "templates": list(template_ids), "count": len(template_ids)}
        params["trails"] = trails
        cursor.execute(_COPY_RUNS, params)
        # As autovacuum leaves a table a year old: statistics and the visibility map (an
        # index-only scan, a count's, reads no heap page the map marks all-visible).
        cursor.execute(
            "VACUUM ANALYZE loops_looprun, loops_loopstep, loops_loopevent, loops_usagebucket"
        )
        counts = {}
        for table in ("loops_looprun", "loops_loopstep", "loops_loopevent", "loops_usagebucket"):
            cursor.execute(f"SELECT count(*) FROM {table}")  # noqa: S608 (constant names)
            counts[table] = int(cursor.fetchone()[0])
    return {**counts, "trails": trails}


def _session_cookie() -> str:
    """A logged-in operator's session id (the UI pages)."""
    from django.test import Client

    from orchestrator.accounts.roles import Role
    from orchestrator.accounts.services import user_ensure

    client = Client()
    client.force_login(user_ensure(username="bench-volume", roles=[Role.OPERATOR]))
    return str(client.cookies["sessionid"].value)


def _pages(service: common.Service, run_id: str) -> dict[str, tuple[Any, str]]:
    import httpx2

    ui = httpx2.Client(
        base_url=f"http://127.0.0.1:{service.port}",
        cookies={"sessionid": _session_cookie()},
        timeout=120,
    )
    api = service.http
    key = service.pattern
    return {
        "runs list": (api, f"/runs?pattern={key}&status=succeeded&limit=20"),
        "run detail": (api, f"/runs/{run_id}"),
        "run events page": (api, f"/runs/{run_id}/events?limit=100"),
        "monitor page": (ui, "/"),
        "metrics page": (ui, "/ui/metrics"),
        "approvals queue": (api, "/approvals?status=pending&limit=20"),
    }


def _timed(pages: dict[str, tuple[Any, str]], samples: int) -> dict[str, float]:
    out = {}
    for name, (client, path) in pages.items():
        for _ in range(WARMUP):
            client.get(path)
        times = []
        for _ in range(samples):
            started = time.perf_counter()
            response = client.get(path)
            times.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                raise RuntimeError(f"{path}: {response.status_code} {response.text[:300]}")
        out[name] = statistics.median(times)
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from loops.models import ActionApproval

    service = common.Service("volume", prefix="vol", maker_steps=8, tools=TOOLS)
    try:
        templates = [service.trigger(steps=8)[0] for _ in range(args.templates)]
        common.wait_status(templates, ["succeeded"], 300)
        parked = [service.trigger(steps=1, gate=1)[0] for _ in range(args.parked)]
        common.wait_status(parked, ["waiting_approval"], 300)
        pending = ActionApproval.objects.filter(status="pending").count()
        pages = _pages(service, templates[0])
        small = _timed(pages, args.samples)
        started = time.monotonic()
        counts = seed(args.runs, templates, args.events)
        seed_s = time.monotonic() - started
        large = _timed(pages, args.samples)
    finally:
        service.close()
    return {
        "small": small,
        "large": large,
        "counts": counts,
        "seed_s": seed_s,
        "pending": pending,
        "load": common.load_average(),
    }


def run(smoke: bool = False) -> list[dict[str, Any]]:
    if not common.redis_available():
        raise RuntimeError(f"Redis is needed at {common.BENCH_REDIS}")
    runs, samples = (SMOKE_RUNS, 5) if smoke else (RUNS, SAMPLES)
    templates, parked = (SMOKE_TEMPLATES, SMOKE_PARKED) if smoke else (TEMPLATES, PARKED)
    logs = common.log_dir("volume")
    with common.ScratchDatabase("volume") as db:
        argv = ["--runs", str(runs), "--samples", str(samples)]
        argv += ["--events", "0" if smoke else str(EVENTS)]
        argv += ["--templates", str(templates), "--parked", str(parked)]
        result = common.run_child("bench.volume", db.env(), argv, 3600, logs)
        # Retention under load, on the year just copied (bench/volume_prune.py).
        prune_rows = volume_prune.run_on(db.env(), logs, smoke=smoke)
    counts = result["counts"]
    rows = []
    for name, small in result["small"].items():
        large = result["large"][name]
        ratio = large / small if small else float("inf")
        rows.append(
            common.row(
                f"volume: {name} with {counts['loops_looprun']:,} runs / small database",
                f"<= {RATIO_LIMIT:g} x",
                median_ms=large,
                passed=ratio <= RATIO_LIMIT,
                ratio=round(ratio, 3),
                reference=f"{small:.2f} ms with {templates + parked} runs",
                rows=counts,
                seed_s=round(result["seed_s"], 1),
            )
        )
    return [*rows, *prune_rows]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.volume", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    child = sub.add_parser("child", help="(internal) measure in this process")
    child.add_argument("--out", required=True)
    child.add_argument("--runs", type=int, default=RUNS)
    child.add_argument("--events", type=int, default=EVENTS)
    child.add_argument("--samples", type=int, default=SAMPLES)
    child.add_argument("--templates", type=int, default=TEMPLATES)
    child.add_argument("--parked", type=int, default=PARKED)
    seeder = sub.add_parser("seed", help="copy the finished runs of DATABASE_URL's database")
    seeder.add_argument("--runs", type=int, default=RUNS)
    seeder.add_argument("--events", type=int, default=0, help="at least this many events")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "child":
        common.child_main(measure, args)
    elif args.command == "seed":
        import os

        import django

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")

        django.setup()
        from loops.models import LoopRun

        ids = list(LoopRun.objects.filter(status="succeeded").values_list("id", flat=True)[:50])
        if not ids:
            raise SystemExit("no succeeded run to copy: run some first")
        print(seed(args.runs, ids, args.events))
    else:
        for line in run(smoke=args.smoke):
            print(line)


if __name__ == "__main__":
    main(sys.argv[1:])

"""API latency through the production ASGI server, idle service (issue 28, target 1).

What a person or a script feels: the round trip of one request from a client on loopback to
uvicorn serving ``orchestrator.asgi:application`` and back, on a scratch PostgreSQL database,
with nothing else running (the worker is stopped before the measurement; runs a trigger creates
stay queued). The requests, each timed ``SAMPLES`` times after a warm-up, in ``PASSES`` passes
(the figure is the median of the passes' medians):

- ``POST /api/v1/patterns/<key>/trigger``;
- ``POST /api/v1/approvals/<id>/decide`` (approve), each on its own pending approval;
- ``GET /api/v1/runs/<id>``;
- ``GET /api/v1/runs?status=waiting_approval&pattern=<key>&limit=50`` (a full page).

Set-up: the demo team on the offline scripted model, ``PARKED`` runs whose maker proposes a
gated ``write``, one ``celery worker`` (production invoker) until every run is parked, then
stopped. ``python -m bench.api_latency [--smoke]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bench import common

PATTERN = "bench-api"
PASSES, SMOKE_PASSES = 3, 1
SAMPLES, SMOKE_SAMPLES = 60, 5
WARMUP = 10
TARGETS_P50_MS = {"trigger": 10.0, "decide": 10.0, "run detail": 15.0, "runs list": 20.0}
TARGET_TRIGGER_P99_MS = 25.0


def _seed(parked: int) -> str:
    """The demo team, the pattern and ``parked`` runs (queued); returns an API token."""
    from loops.services.patterns import pattern_create
    from loops.services.runs import run_trigger
    from orchestrator.accounts.roles import Role
    from orchestrator.accounts.services import api_token_create, user_ensure
    from orchestrator.management.commands.seed_demo import ensure_demo_team

    ensure_demo_team()
    pattern = pattern_create(
        key=PATTERN,
        actor="bench",
        goal_template="Update `{{ inputs.path }}` for the API latency benchmark.",
        leader_username="demo-leader",
        maker_usernames=["demo-maker"],
        verifier_username="demo-verifier",
    )
    for i in range(parked):
        run_trigger(pattern=pattern, actor="bench", inputs={"path": f"bench-{i}.txt"})
    roles = [Role.OPERATOR, Role.APPROVER]
    return str(api_token_create(user=user_ensure(username="bench-api", roles=roles)))


def _park(parked: int, env: dict[str, str], logs: Any) -> None:
    """Run a production worker until every seeded run waits for its approval, then stop it."""
    from loops.models import ActionApproval, ApprovalStatus

    worker = common.worker_proc("worker", {**env, "LOG_LEVEL": "WARNING"}, logs, threads=2)
    worker.start()
    deadline = time.monotonic() + 900
    try:
        while ActionApproval.objects.filter(status=ApprovalStatus.PENDING).count() < parked:
            if not worker.alive():
                raise RuntimeError(f"the worker exited:\n{worker.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"runs not parked in 900 s:\n{worker.log()}")
            time.sleep(0.5)
    finally:
        worker.stop()


def _timed(call: Callable[[], Any], samples: int) -> list[float]:
    out = []
    for _ in range(samples):
        sent = time.perf_counter()
        call()
        out.append((time.perf_counter() - sent) * 1000)
    return out


def _expect(response: Any, status: int) -> Any:
    if response.status_code != status:
        raise RuntimeError(f"{response.request.url}: {response.status_code} {response.text[:500]}")
    return response


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import httpx2

    from loops.models import ActionApproval, ApprovalStatus, LoopRun

    passes, samples = args.passes, args.samples
    parked = passes * (samples + WARMUP)
    token = _seed(parked)
    logs = common.log_dir("api_latency")
    env = common.service_env(LOOPWRIGHT_INVOKER="loops.worker.invoker.AgentInvoker")
    _park(parked, env, logs)
    port = common.free_port()
    common.web_proc(env, logs, port).start()
    common.wait_http(f"http://127.0.0.1:{port}/healthz")
    pending = iter(
        ActionApproval.objects.filter(status=ApprovalStatus.PENDING)
        .order_by("id")
        .values_list("id", flat=True)
    )
    run_ids = [str(r) for r in LoopRun.objects.values_list("id", flat=True)[:50]]
    figures: dict[str, list[float]] = {name: [] for name in TARGETS_P50_MS}
    trigger_p99: list[float] = []
    headers = {"Authorization": f"Bearer {token}"}
    base = f"http://127.0.0.1:{port}/api/v1"
    with httpx2.Client(base_url=base, headers=headers, timeout=60) as http:
        calls: dict[str, Callable[[], Any]] = {
            "trigger": lambda: _expect(
                http.post(f"/patterns/{PATTERN}/trigger", json={"inputs": {"path": "t.txt"}}), 201
            ),
            "decide": lambda: _expect(
                http.post(f"/approvals/{next(pending)}/decide", json={"decision": "approve"}), 200
            ),
            "run detail": lambda: _expect(http.get(f"/runs/{run_ids[0]}"), 200),
            "runs list": lambda: _expect(
                http.get(f"/runs?status=waiting_approval&pattern={PATTERN}&limit=50"), 200
            ),
        }
        for _ in range(passes):
            for name, call in calls.items():
                _timed(call, WARMUP)
                times = _timed(call, samples)
                figures[name].append(statistics.median(times))
                if name == "trigger":
                    trigger_p99.append(common.percentile(times, 99))
    return {"p50s": figures, "trigger_p99s": trigger_p99, "load": common.load_average()}


def run(smoke: bool = False) -> list[dict[str, Any]]:
    if not common.redis_available():
        raise RuntimeError(f"Redis is needed at {common.BENCH_REDIS}")
    passes, samples = (SMOKE_PASSES, SMOKE_SAMPLES) if smoke else (PASSES, SAMPLES)
    logs = common.log_dir("api_latency")
    with common.ScratchDatabase("api_latency") as db:
        argv = ["--passes", str(passes), "--samples", str(samples)]
        result = common.run_child("bench.api_latency", db.env(), argv, 1800, logs)
    rows = []
    for name, target in TARGETS_P50_MS.items():
        p50s = result["p50s"][name]
        p50 = statistics.median(p50s)
        rows.append(
            common.row(
                f"API {name} round trip, uvicorn, idle service, p50",
                f"<= {target:g} ms",
                median_ms=p50,
                spread=common.spread(p50s),
                passed=p50 <= target,
                samples=samples * passes,
            )
        )
    p99 = statistics.median(result["trigger_p99s"])
    rows.append(
        common.row(
            "API trigger round trip, uvicorn, idle service, p99",
            f"<= {TARGET_TRIGGER_P99_MS:g} ms",
            median_ms=p99,
            passed=p99 <= TARGET_TRIGGER_P99_MS,
            samples=samples * passes,
        )
    )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.api_latency", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    child = sub.add_parser("child", help="(internal) measure in this process")
    child.add_argument("--out", required=True)
    child.add_argument("--passes", type=int, default=PASSES)
    child.add_argument("--samples", type=int, default=SAMPLES)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "child":
        common.child_main(measure, args)
    else:
        for line in run(smoke=args.smoke):
            print(line)


if __name__ == "__main__":
    main(sys.argv[1:])

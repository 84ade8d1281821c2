"""Skill execution latency: a trivial Python skill from request to stored result, through the
whole execution path.

What is timed per call: ``execution_request`` (access check, input validation, rate-limit
count, rendering, the row, the Celery nudge after commit), the skills worker receiving it,
claiming the row (lease), running ``print(...)`` in the bubblewrap sandbox, storing the result
fenced by the lease token, and the caller seeing the finished row (polling as the agent tool
and the MCP server do). The reference is the bare sandbox call (``run_sandboxed``) measured in
the same child, so ``ratio`` is what the queue and the database add on top of isolation.

The database is a scratch one (PostgreSQL with Redis as the broker when both are reachable,
else SQLite with the filesystem broker), dropped afterwards. ``python -m bench.skill_latency
[--smoke]`` prints the rows; ``python -m bench skill_latency`` runs it with the others.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from bench.common import (
    BENCH_REDIS,
    Proc,
    ScratchDatabase,
    child_main,
    log_dir,
    percentile,
    redis_available,
    row,
    run_child,
)

#: Start-to-result targets in ms: the sandbox itself is ~50 ms here (bench.sandbox_latency).
TARGET_MEDIAN_MS, TARGET_P99_MS = 300.0, 1000.0


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    from orchestrator.accounts.roles import Role
    from orchestrator.accounts.services import user_ensure
    from sandbox import SandboxRequest, run_sandboxed
    from skillhub.services.access import Caller
    from skillhub.services.executions import execution_request, execution_wait
    from skillhub.services.skills import skill_create

    user = user_ensure(username="bench", roles=[Role.OPERATOR])
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    skill = skill_create(
        actor="bench", tool_name="bench_echo", title="echo", code_template="print({{n}})",
        language="python", input_schema=schema,
    )  # fmt: skip
    caller = Caller.for_user(user)
    timings: list[float] = []
    for i in range(args.warmup + args.runs):
        started = time.perf_counter()
        execution = execution_request(skill=skill, inputs={"n": i}, caller=caller, origin="api")
        done = execution_wait(execution_id=execution.id, timeout=60)
        elapsed = (time.perf_counter() - started) * 1000
        if done.status != "succeeded" or done.stdout != f"{i}\n":
            raise RuntimeError(f"unexpected execution result: {done.status} {done.error}")
        if i >= args.warmup:
            timings.append(elapsed)
    bare = []
    for _ in range(max(5, args.runs // 4)):
        started = time.perf_counter()
        run_sandboxed(SandboxRequest(language="python", code="print(1)"))
        bare.append((time.perf_counter() - started) * 1000)
    return {"timings": timings, "bare_median": statistics.median(bare)}


def _skills_worker(env: dict[str, str], logs: Any) -> Proc:
    argv = [
        sys.executable, "-m", "celery", "-A", "orchestrator", "worker", "-Q", "skills",
        "--pool", "threads", "-c", "2", "--without-gossip", "--without-mingle",
        "--without-heartbeat", "-l", "INFO", "-n", "bench-skills@%h",
    ]  # fmt: skip
    return Proc("skills-worker", argv, env, logs)


def _vendor() -> str:
    try:
        from bench.common import pg_admin

        pg_admin("SELECT 1")
    except Exception:
        return "sqlite"
    return "postgresql" if redis_available() else "sqlite"


def run(smoke: bool = False) -> list[dict[str, Any]]:
    vendor = _vendor()
    runs = 10 if smoke else 200
    logs = log_dir("skill-latency")
    with ScratchDatabase("skills", vendor) as database:
        broker = BENCH_REDIS if vendor == "postgresql" else "filesystem://"
        env = database.env(
            CELERY_BROKER_URL=broker, REDIS_URL=broker if vendor == "postgresql" else "",
            LOOPWRIGHT_SKILL_RATE_LIMIT_PER_MINUTE="100000",
        )  # fmt: skip
        worker = _skills_worker(env, logs).start()
        try:
            worker.wait_for_log("ready.", timeout=120)
            result = run_child(
                "bench.skill_latency", env, ["--runs", str(runs), "--warmup", "3"],
                timeout=900, log_dir=logs,
            )  # fmt: skip
        finally:
            worker.stop()
    timings = [float(t) for t in result["timings"]]
    median, p99 = statistics.median(timings), percentile(timings, 99)
    bare = float(result["bare_median"])
    return [
        row(
            f"trivial Python skill request-to-result via the skills queue ({vendor})",
            f"median <= {TARGET_MEDIAN_MS:g} ms, p99 <= {TARGET_P99_MS:g} ms",
            passed=median <= TARGET_MEDIAN_MS and p99 <= TARGET_P99_MS,
            median_ms=median,
            p99_ms=round(p99, 1),
            ratio=round(median / bare, 2) if bare else None,
            reference=f"bare sandbox call {bare:.1f} ms (median)",
            runs=len(timings),
        )
    ]


def main(argv: list[str]) -> None:
    if argv and argv[0] == "child":
        parser = argparse.ArgumentParser()
        parser.add_argument("child")
        parser.add_argument("--out", required=True)
        parser.add_argument("--runs", type=int, default=100)
        parser.add_argument("--warmup", type=int, default=3)
        child_main(_measure, parser.parse_args(argv))
        return
    for result in run(smoke="--smoke" in argv):
        print(result)


if __name__ == "__main__":
    main(sys.argv[1:])

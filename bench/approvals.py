"""A4: approve → resume latency with an idle real worker (docs/reliability.md A4).

What is measured, precisely. The end point is the moment the approved ``write`` call starts in
the worker: the production tool, wrapped so that its first act is to stamp the wall clock. The
start point, for the pass/fail figures, is the approve itself: the server's ``decided_at`` of
the ``POST /api/v1/approvals/<id>/decide`` that answered 200 (written in the transaction whose
commit releases the run and sends the nudge). Both stamps come from processes of this machine,
one clock. Informative rows: from the moment this client *has* the 200 (under load the tool
often starts first, so values below zero are expected), the request's round trip, and
``approval.resumed`` → ``lease.claimed`` from the server's own event rows.

Set-up, all of it scratch and removed afterwards: a temporary ``LOOPWRIGHT_VAR_DIR``; a SQLite
file in it, or the PostgreSQL database ``lw_bench_appr`` when ``DATABASE_URL`` points at
PostgreSQL (the broker is then Redis database 11, as in production; on SQLite the embedded
filesystem broker); ``manage.py migrate`` in a subprocess; the demo team on the offline scripted
model; N runs whose maker proposes a gated ``write``; uvicorn serving the app on a free port; one
``celery worker`` with production defaults (the production AgentInvoker, its ``write`` wrapped to
stamp its start). Once every run is parked, the approvals are sent at 5 per second.

``python -m bench.approvals [--smoke]`` prints the rows; ``run(smoke)`` returns them (200
approvals; 5 in smoke mode). Targets: p50 ≤ 200 ms, p99 ≤ 1 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = "lw_bench_appr"
BENCH_REDIS = "redis://127.0.0.1:6379/11"
COUNT, SMOKE_COUNT = 200, 5
RATE = 5.0  # approvals per second
TARGET_P50_MS, TARGET_P99_MS = 200.0, 1000.0
MARKS_ENV = "LW_BENCH_APPR_MARKS"
PATTERN = "bench-approvals"


# --- inside the worker: the production invoker, its write stamped as it starts -----------------


class _StampedWrite:
    def __init__(self, inner: Any, marks: Path) -> None:
        self.inner, self.marks = inner, marks

    @property
    def spec(self) -> Any:
        return self.inner.spec

    async def run(self, arguments: dict[str, Any], context: Any) -> Any:
        started = time.time()
        approval = context.idempotency_key.rpartition(":approval:")[2]
        if approval:
            mark = {"t": started, "key": context.idempotency_key}
            (self.marks / f"{approval}.json").write_text(json.dumps(mark))
        return await self.inner.run(arguments, context)


def _marking_invoker() -> Any:
    from loops.worker.invoker import AgentInvoker
    from runtime.tools import ToolRegistry

    class MarkingInvoker(AgentInvoker):
        """The production AgentInvoker; only its ``write`` writes a start stamp first."""

        def __init__(self) -> None:
            super().__init__()
            marks = Path(os.environ[MARKS_ENV])
            self.tools = ToolRegistry(
                _StampedWrite(t, marks) if t.spec.name == "write" else t for t in self.tools
            )

    return MarkingInvoker()


class MarkingInvoker:
    """``LOOPWRIGHT_INVOKER=bench.approvals.MarkingInvoker`` (built lazily: Django is set up)."""

    @classmethod
    def build(cls) -> Any:
        return _marking_invoker()


# --- inside a Django subprocess: the team, the pattern, the runs, a token ----------------------


def setup_main(count: int) -> None:
    import django

    django.setup()
    from loops.services.patterns import pattern_create
    from loops.services.runs import run_trigger
    from orchestrator.accounts.roles import Role
    from orchestrator.accounts.services import api_token_create, user_ensure
    from orchestrator.management.commands.seed_demo import ensure_demo_team

    ensure_demo_team()
    pattern = pattern_create(
        key=PATTERN,
        actor="bench",
        goal_template="Update `{{ inputs.path }}` for the approvals benchmark.",
        leader_username="demo-leader",
        maker_usernames=["demo-maker"],
        verifier_username="demo-verifier",
    )
    for i in range(count):
        run_trigger(pattern=pattern, actor="bench", inputs={"path": f"bench-{i}.txt"})
    token = api_token_create(user=user_ensure(username="bench-approver", roles=[Role.APPROVER]))
    print(json.dumps({"token": token}))


# --- the scratch world --------------------------------------------------------------------------


def _postgres() -> bool:
    return os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://"))


def _pg_url(dbname: str) -> str:
    parts = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit((parts.scheme, parts.netloc, f"/{dbname}", "", ""))


def _pg_admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(_pg_url("postgres"), autocommit=True) as conn:
        conn.execute(sql)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Scratch:
    """The temporary directory, database, processes and environment of one measurement."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.marks = tmp / "marks"
        self.marks.mkdir()
        self.port = _free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {
            "LOOPWRIGHT_VAR_DIR": str(tmp / "var"),
            "DJANGO_SETTINGS_MODULE": "orchestrator.settings",
            "LOOPWRIGHT_PUBLIC_URL": f"http://127.0.0.1:{self.port}",
            MARKS_ENV: str(self.marks),
            "PYTHONUNBUFFERED": "1",
        }
        if _postgres():
            self.env.update(
                DATABASE_URL=_pg_url(BENCH_DB), CELERY_BROKER_URL=BENCH_REDIS, REDIS_URL=BENCH_REDIS
            )
        else:
            self.env["DATABASE_URL"] = f"sqlite:///{tmp / 'bench.sqlite3'}"
            self.env["CELERY_BROKER_URL"] = "filesystem://"
            self.env["REDIS_URL"] = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def python(self, *argv: str, timeout: float = 900) -> str:
        result = subprocess.run(
            [sys.executable, *argv], cwd=ROOT, env={**os.environ, **self.env},
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"{argv} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
        return result.stdout

    def spawn(self, name: str, *argv: str, **env: str) -> Path:
        log = self.tmp / f"{name}.log"
        with open(log, "ab") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, *argv], cwd=ROOT, env={**os.environ, **self.env, **env},
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        return log

    def check_alive(self) -> None:
        """Raise when a process of the measurement died (with the end of its log)."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the {name} process exited ({proc.returncode}):\n{tail}")

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


@contextlib.contextmanager
def scratch() -> Iterator[Scratch]:
    tmp = Path(tempfile.mkdtemp(prefix="lw-bench-appr-"))
    world = Scratch(tmp)
    if _postgres():
        _pg_admin(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
        _pg_admin(f"CREATE DATABASE {BENCH_DB}")
    try:
        yield world
    finally:
        world.stop()
        if _postgres():
            _pg_admin(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
        shutil.rmtree(tmp, ignore_errors=True)


# --- the measurement ----------------------------------------------------------------------------


def _wait(
    what: str, predicate: Any, timeout: float, world: Scratch, log: Path | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        world.check_alive()
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
    raise TimeoutError(f"{what} not reached in {timeout:.0f} s\n{tail}")


def _healthy(client: Any) -> bool:
    try:
        return bool(client.get("/healthz").status_code == 200)
    except Exception:
        return False


def _pending(client: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    url = "/api/v1/approvals?status=pending&limit=200"
    while url:
        page = client.get(url).json()
        found.extend(page["results"])
        url = page.get("next") or ""
    return found


def _approve_all(
    client: Any, approvals: list[dict[str, Any]], world: Scratch
) -> dict[str, dict[str, float]]:
    """Approve at RATE per second. By approval id: when the request left (``sent``) and its 200
    arrived (``answered``), in this process's wall clock, and the server's ``decided_at``."""
    moments: dict[str, dict[str, float]] = {}
    start = time.monotonic()
    for n, approval in enumerate(approvals):
        world.check_alive()  # a dead worker would make every later figure meaningless
        time.sleep(max(0.0, start + n / RATE - time.monotonic()))
        sent = time.time()
        response = client.post(
            f"/api/v1/approvals/{approval['id']}/decide", json={"decision": "approve"}
        )
        answered = time.time()
        if response.status_code != 200:
            raise RuntimeError(f"decide {approval['id']}: {response.status_code} {response.text}")
        decided = datetime.fromisoformat(response.json()["decided_at"]).timestamp()
        moments[approval["id"]] = {"sent": sent, "answered": answered, "decided": decided}
    return moments


def _claim_delays(client: Any, approvals: list[dict[str, Any]]) -> list[float]:
    """ms from ``approval.resumed`` to the next ``lease.claimed`` of the run (server stamps)."""
    delays = []
    for approval in approvals:
        events = client.get(f"/api/v1/runs/{approval['run']}/events?limit=500").json()["results"]
        resumed = next(e for e in events if e["type"] == "approval.resumed")
        claimed = next(
            e for e in events if e["type"] == "lease.claimed" and e["seq"] > resumed["seq"]
        )
        moments = [datetime.fromisoformat(e["created_at"]) for e in (resumed, claimed)]
        delays.append((moments[1] - moments[0]).total_seconds() * 1000)
    return delays


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _measure(world: Scratch, count: int) -> dict[str, Any]:
    import httpx2

    world.python("manage.py", "migrate", "--noinput")
    token = json.loads(world.python("-m", "bench.approvals", "setup", "--count", str(count)))[
        "token"
    ]
    web = world.spawn(
        "web", "-m", "uvicorn", "orchestrator.asgi:application", "--host", "127.0.0.1",
        "--port", str(world.port), "--no-access-log", "--log-level", "warning",
    )  # fmt: skip
    worker = world.spawn(
        "worker", "-m", "celery", "-A", "orchestrator", "worker", "-Q", "loops", "--pool",
        "threads", "-c", "2", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "-l", "INFO", "-n", "bench-approvals@%h",
        LOOPWRIGHT_INVOKER="bench.approvals.MarkingInvoker",
    )  # fmt: skip
    headers = {"Authorization": f"Bearer {token}"}
    with httpx2.Client(base_url=world.url, headers=headers, timeout=60) as client:
        _wait("web server up", lambda: _healthy(client), 120, world, web)
        _wait("worker ready", lambda: b"ready." in worker.read_bytes(), 120, world, worker)
        _wait("every run parked", lambda: len(_pending(client)) == count, 900, world, worker)
        time.sleep(2)  # let the worker go idle (nothing left to claim, only its poll)
        approvals = _pending(client)
        moments = _approve_all(client, approvals, world)
        marks = world.marks
        _wait(
            "every approved write started",
            lambda: len(list(marks.iterdir())) == count,
            600,
            world,
            worker,
        )
        world.check_alive()
        started = {
            p.stem: json.loads(p.read_text())["t"] for p in marks.iterdir() if p.suffix == ".json"
        }
        claims = _claim_delays(client, approvals)
    return {
        "decided": [(started[a] - m["decided"]) * 1000 for a, m in moments.items()],
        "answered": [(started[a] - m["answered"]) * 1000 for a, m in moments.items()],
        "round_trip": [(m["answered"] - m["sent"]) * 1000 for m in moments.values()],
        "claims": claims,
    }


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "median_ms": statistics.median(values),
        "p99_ms": _percentile(values, 99),
        "min_ms": min(values),
        "max_ms": max(values),
    }


def _rows(figures: dict[str, list[float]], count: int) -> list[dict[str, Any]]:
    decided = figures["decided"]
    p50, p99 = statistics.median(decided), _percentile(decided, 99)
    load = "{:.1f}/{:.1f}/{:.1f}".format(*os.getloadavg())
    common = {"n": count, "database": "postgresql" if _postgres() else "sqlite", "load": load}
    info = {"target": "informative", "passed": True, **common}
    return [
        {
            "figure": "approve (decided, answered 200) → approved tool starts, p50",
            "target": f"≤ {TARGET_P50_MS:.0f} ms",
            **_summary(decided),
            "passed": p50 <= TARGET_P50_MS,
            **common,
        },
        {
            "figure": "approve (decided, answered 200) → approved tool starts, p99",
            "target": f"≤ {TARGET_P99_MS:.0f} ms",
            "median": p99,
            "unit": "ms",
            "passed": p99 <= TARGET_P99_MS,
            **common,
        },
        {
            "figure": "client has the 200 → approved tool starts (< 0: tool first)",
            **_summary(figures["answered"]),
            **info,
        },
        {"figure": "decide request round trip", **_summary(figures["round_trip"]), **info},
        {
            "figure": "approval.resumed → lease.claimed (server stamps)",
            **_summary(figures["claims"]),
            **info,
        },
    ]


def run(smoke: bool = False) -> list[dict[str, Any]]:
    count = SMOKE_COUNT if smoke else COUNT
    with scratch() as world:
        figures = _measure(world, count)
    return _rows(figures, count)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.approvals", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_COUNT} approvals")
    sub = parser.add_subparsers(dest="command")
    setup = sub.add_parser("setup", help="(internal) seed the scratch database")
    setup.add_argument("--count", type=int, required=True)
    args = parser.parse_args(argv)
    if args.command == "setup":
        setup_main(args.count)
        return
    for row in run(smoke=args.smoke):
        print(json.dumps(row, default=str))


if __name__ == "__main__":
    main()

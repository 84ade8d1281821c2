"""Shared pieces of the engine benchmarks: scratch databases, processes, a model server, stats.

* **Scratch databases.** PostgreSQL databases named ``lw_bench_*`` (the prefix is
  ``LOOPWRIGHT_BENCH_DB_PREFIX``; Redis is ``LOOPWRIGHT_BENCH_REDIS``, default db 10) on the
  ``DATABASE_URL`` server (default ``postgres://postgres@127.0.0.1:5432/``), or a SQLite file
  in a temporary directory. Migrations run once per bench process, in a subprocess, into a
  template that every scratch database is cloned from; everything is dropped at the end (and
  at exit).
* **Processes.** Each benchmark drives Django in a child process of its own (Django's settings
  are per process, and every benchmark has its own database). Every process started here gets
  its own session and dies with its parent (``PR_SET_PDEATHSIG``); :meth:`Proc.stop` ends its
  whole process group. Nothing is ever stopped by name.
* **The model server.** ``python -m bench.common model-server``: an OpenAI-compatible endpoint on
  127.0.0.1 (asyncio, keep-alive) that plays a deterministic agent with a fixed latency and
  timestamps the first request of every tagged run (``time.monotonic()``, which is one clock for
  every process of the machine). The goal of a bench run carries ``[bench k=v ...]``: ``tag``,
  ``steps`` (tool-calling steps of the maker), ``gate=1`` (then a ``write`` that the default
  harness gates for approval).
* **The bench invoker.** ``LOOPWRIGHT_INVOKER=bench.common.BenchAgentInvoker``: the production
  :class:`~loops.worker.invoker.AgentInvoker` with two bench tools added to the builtin
  registry: ``bench_noop`` (read effect, does nothing) and a ``write`` with the builtin schema
  that records when it starts (``LW_BENCH_MARK_DIR``) instead of writing.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SERVER = "postgres://postgres@127.0.0.1:5432/"
#: Redis of the service benchmarks and the prefix of their scratch databases; both can be moved
#: (``LOOPWRIGHT_BENCH_REDIS``, ``LOOPWRIGHT_BENCH_DB_PREFIX``) so parallel runs do not collide.
BENCH_REDIS = os.environ.get("LOOPWRIGHT_BENCH_REDIS", "redis://127.0.0.1:6379/10")
PREFIX = os.environ.get("LOOPWRIGHT_BENCH_DB_PREFIX", "lw_bench_")


# --- statistics --------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linear between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    if len(ordered) == 1:
        return float(ordered[0])
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (position - low))


def spread(values: Sequence[float]) -> str:
    """How far repeats disagree: ``±`` half the range, relative to their median."""
    if len(values) < 2:
        return "n=1"
    median = statistics.median(values)
    if median == 0:
        return "-"
    return f"±{(max(values) - min(values)) / 2 / median:.0%}"


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f}/{five:.1f}/{fifteen:.1f} on {os.cpu_count()} cores"


def row(
    figure: str,
    target: str,
    *,
    passed: bool | None,
    median: float | None = None,
    median_ms: float | None = None,
    unit: str = "",
    **extra: Any,
) -> dict[str, Any]:
    """A result row in the runner's shape; ``passed=None`` (informative rows) counts as a pass."""
    out: dict[str, Any] = {"figure": figure, "target": target}
    if median is not None:
        out["median"] = round(median, 3)
    if median_ms is not None:
        out["median_ms"] = round(median_ms, 3)
    if unit:
        out["unit"] = unit
    out.update({k: v for k, v in extra.items() if v is not None})
    out["passed"] = True if passed is None else bool(passed)
    out.setdefault("load", load_average())
    return out


def ratio(ours: float | None, reference: float | None) -> float | None:
    if ours is None or not reference:
        return None
    return round(ours / reference, 3)


# --- scratch databases ---------------------------------------------------------------------------


def server_url() -> str:
    url = os.environ.get("DATABASE_URL", "")
    return url if url.startswith(("postgres://", "postgresql://")) else DEFAULT_SERVER


def pg_url(dbname: str) -> str:
    parts = urlsplit(server_url())
    return urlunsplit((parts.scheme, parts.netloc, f"/{dbname}", "", ""))


def pg_admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(pg_url("postgres"), autocommit=True) as conn:
        conn.execute(sql)


def _migrate(database_url: str, var_dir: str) -> None:
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "LOOPWRIGHT_VAR_DIR": var_dir,
        "CELERY_BROKER_URL": "memory://",
        "DJANGO_SETTINGS_MODULE": "orchestrator.settings",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        raise RuntimeError(f"migrate failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")


_templates: dict[str, str] = {}
_roots: list[Path] = []


def scratch_root() -> Path:
    """This process's temporary directory (made on first use: workers never need one)."""
    if not _roots:
        _roots.append(Path(tempfile.mkdtemp(prefix="lw-bench-")))
    return _roots[0]


def _cleanup_templates() -> None:
    for vendor, name in list(_templates.items()):
        with contextlib.suppress(Exception):
            if vendor == "postgresql":
                pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    _templates.clear()
    for root in _roots:
        shutil.rmtree(root, ignore_errors=True)


atexit.register(_cleanup_templates)


def _template(vendor: str) -> str:
    """A migrated database (PostgreSQL name or SQLite path) to clone scratch databases from."""
    if vendor in _templates:
        return _templates[vendor]
    var_dir = str(scratch_root() / "var-template")
    if vendor == "postgresql":
        name = f"{PREFIX}tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        pg_admin(f'CREATE DATABASE "{name}"')
        _templates[vendor] = name
        _migrate(pg_url(name), var_dir)
    else:
        path = scratch_root() / "template.sqlite3"
        _templates[vendor] = str(path)
        _migrate(f"sqlite:///{path}", var_dir)
    return _templates[vendor]


class ScratchDatabase:
    """A migrated database for one benchmark, dropped on exit from the ``with`` block."""

    def __init__(self, label: str, vendor: str = "postgresql") -> None:
        self.vendor = vendor
        self.label = f"{label}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.var_dir = scratch_root() / f"var-{self.label}"
        self.url = ""
        self._name = ""

    def __enter__(self) -> ScratchDatabase:
        template = _template(self.vendor)
        self.var_dir.mkdir(parents=True, exist_ok=True)
        if self.vendor == "postgresql":
            self._name = f"{PREFIX}{self.label}"
            pg_admin(f'CREATE DATABASE "{self._name}" TEMPLATE "{template}"')
            self.url = pg_url(self._name)
        else:
            path = self.var_dir / "bench.sqlite3"
            shutil.copyfile(template, path)
            self.url = f"sqlite:///{path}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._name:
            with contextlib.suppress(Exception):
                pg_admin(f'DROP DATABASE IF EXISTS "{self._name}" WITH (FORCE)')
        shutil.rmtree(self.var_dir, ignore_errors=True)

    def env(self, **extra: str) -> dict[str, str]:
        """Environment of a process working on this database (a Django process, a worker)."""
        env = {
            "DATABASE_URL": self.url,
            "LOOPWRIGHT_VAR_DIR": str(self.var_dir),
            "CELERY_BROKER_URL": "memory://",
            "DJANGO_SETTINGS_MODULE": "orchestrator.settings",
            "LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
        }
        env.update(extra)
        return env


# --- processes -----------------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


_live: list[Proc] = []


class Proc:
    """A process of a benchmark (worker, web server, model server, measuring child)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name, self.argv, self.env = name, argv, env
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        _live.append(self)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self, tail: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except FileNotFoundError:
            return ""

    def wait_for_log(self, marker: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if marker in self.log(tail=200_000):
                return
            if not self.alive():
                raise RuntimeError(f"{self.name} exited:\n{self.log()}")
            time.sleep(0.05)
        raise TimeoutError(f"{self.name}: no {marker!r} after {timeout:g} s:\n{self.log()}")

    def memory_mb(self) -> dict[str, float]:
        """Current (VmRSS) and peak (VmHWM) resident memory of the process, in MB."""
        found: dict[str, float] = {}
        with contextlib.suppress(FileNotFoundError):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    found[key] = int(value.split()[0]) / 1024
        return {"rss": found.get("VmRSS", 0.0), "peak": found.get("VmHWM", 0.0)}

    def cpu_seconds(self) -> float:
        """User + system CPU time the process has used so far."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``timeout``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self in _live:
            _live.remove(self)


def stop_all() -> None:
    for proc in reversed(list(_live)):
        proc.stop(timeout=5)


atexit.register(stop_all)


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def child_main(measure: Callable[[argparse.Namespace], Any], args: argparse.Namespace) -> None:
    """Body of a measuring child: Django set up, SIGTERM turned into a clean exit (which stops
    the processes it started), the result written as JSON to ``args.out``."""
    signal.signal(signal.SIGTERM, _raise_exit)
    import django

    django.setup()
    try:
        result = measure(args)
    finally:
        stop_all()
    Path(args.out).write_text(json.dumps(result, default=str))


def run_child(
    module: str, env: dict[str, str], args: Sequence[str], timeout: float, log_dir: Path
) -> Any:
    """Run ``python -m <module> child ...`` and return the JSON it wrote."""
    out = log_dir / f"{module.rsplit('.', 1)[-1]}-{uuid.uuid4().hex[:6]}.json"
    proc = Proc(
        f"child-{module.rsplit('.', 1)[-1]}",
        [sys.executable, "-m", module, "child", "--out", str(out), *args],
        env,
        log_dir,
    ).start()
    assert proc.proc is not None
    try:
        proc.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise TimeoutError(
            f"{module} child did not finish in {timeout:g} s:\n{proc.log()}"
        ) from exc
    finally:
        proc.stop(timeout=20)
    if proc.proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"{module} child failed ({proc.proc.returncode}):\n{proc.log(6000)}")
    return json.loads(out.read_text())


def log_dir(name: str) -> Path:
    path = scratch_root() / f"logs-{name}-{uuid.uuid4().hex[:6]}"
    path.mkdir(parents=True, exist_ok=True)
    return path


# --- the service: workers, web server, model server ---------------------------------------------


def redis_available(url: str = BENCH_REDIS) -> bool:
    try:
        import redis

        return bool(redis.Redis.from_url(url, socket_timeout=2).ping())
    except Exception:
        return False


def worker_proc(name: str, env: dict[str, str], logs: Path, threads: int = 4) -> Proc:
    """A ``celery worker`` as docs/worker.md runs it (threads pool, the run driver inside)."""
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "orchestrator",
        "worker",
        "-Q",
        "loops",
        "--pool",
        "threads",
        "-c",
        str(threads),
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-l",
        "WARNING",
        "-n",
        f"{name}-{uuid.uuid4().hex[:6]}@%h",
    ]
    return Proc(name, argv, env, logs)


def wait_for_worker(proc: Proc, timeout: float = 120) -> None:
    """Ready once the driver's first poll happened (its ``connection`` to the DB is up)."""
    proc.wait_for_log("bench-driver-ready", timeout)


def web_proc(env: dict[str, str], logs: Path, port: int) -> Proc:
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "orchestrator.asgi:application",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    return Proc("web", argv, env, logs)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, timeout: float = 60) -> None:
    import httpx2

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx2.HTTPError):
            httpx2.get(url, timeout=2)
            return
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer in {timeout:g} s")


class ModelServerProc:
    """The loopback model server as a process, with a client for its bench state."""

    def __init__(self, logs: Path, latency: float) -> None:
        self.port = free_port()
        self.proc = Proc(
            "model-server",
            [
                sys.executable,
                "-m",
                "bench.common",
                "model-server",
                "--port",
                str(self.port),
                "--latency",
                str(latency),
            ],
            {"PYTHONUNBUFFERED": "1"},
            logs,
        )
        self._client: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> ModelServerProc:
        self.proc.start()
        self.proc.wait_for_log("model-server listening", 60)
        return self

    def state(self) -> dict[str, Any]:
        import httpx2

        response = httpx2.get(f"http://127.0.0.1:{self.port}/bench/state", timeout=10)
        return dict(response.json())

    def first_request(self, tag: str, timeout: float = 30) -> tuple[float, float]:
        """When the first request of run ``tag`` arrived (monotonic, wall clock): one request
        the server answers once it has (a long poll), so waiting takes no CPU from the
        service being measured (a poll would, on a 2-core machine)."""
        import httpx2

        if self._client is None:
            self._client = httpx2.Client(base_url=f"http://127.0.0.1:{self.port}")
        response = self._client.get(
            "/bench/first", params={"tag": tag, "timeout": timeout}, timeout=timeout + 10
        )
        if response.status_code != 200:
            raise TimeoutError(f"no model request for {tag} in {timeout:g} s")
        arrived = response.json()
        return float(arrived["at"]), float(arrived["wall"])

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
        self.proc.stop(timeout=5)


BENCH_PROFILE = "bench"
"""The harness profile of every bench role: the default profile's tools with the platform's
ceilings as limits, so a long bench run measures steps, not where a limit stops it."""


def bench_profile() -> str:
    """Create the ``bench`` harness profile once (Django set up); returns its tag."""
    from harness.schema import DEFAULT_PLATFORM
    from harness.selectors import profile_get_or_none
    from harness.services import profile_create

    if profile_get_or_none(BENCH_PROFILE) is None:
        from django.conf import settings

        # The platform's limits, as LOOPWRIGHT_HARNESS_PLATFORM sets them (long-run benches).
        limits = dict(DEFAULT_PLATFORM["limits"])
        limits.update(settings.LOOPWRIGHT_HARNESS_PLATFORM.get("limits") or {})
        profile_create(
            tag=BENCH_PROFILE,
            description="Benchmarks: default tools, platform limits.",
            settings={
                "tools": {"allow": ["*"], "trustedPreHandlerTools": []},
                "limits": limits,
                "paths": {"maxFiles": DEFAULT_PLATFORM["paths"]["maxFiles"]},
            },
            created_by="bench",
        )
    return BENCH_PROFILE


def bench_team(
    *, model_url: str, maker_steps: int, tools: Sequence[str], prefix: str = "bench"
) -> str:
    """An endpoint on the model server, three employees and a pattern; returns the pattern key.

    Call with Django set up. The employees' step limit leaves room for ``maker_steps`` tool
    steps, the last normal step and the final answer.
    """
    from loops.services.patterns import pattern_create
    from orchestrator.agents.services import employee_create, model_endpoint_create

    endpoint = model_endpoint_create(
        name=f"{prefix}-model",
        provider="openai",
        base_url=model_url,
        model="bench-model",
        max_retries=0,
        timeout_seconds=60,
    )
    for role in ("leader", "maker", "verifier"):
        employee_create(
            username=f"{prefix}-{role}",
            endpoint=endpoint,
            system_prompt=f"Bench {role}.",
            tools=list(tools),
            max_steps=min(1000, maker_steps + 3),
        )
    pattern_create(
        key=prefix,
        actor="bench",
        title="Bench",
        goal_template="Bench {{ inputs.get('spec') }}",
        leader_username=f"{prefix}-leader",
        maker_usernames=[f"{prefix}-maker"],
        verifier_username=f"{prefix}-verifier",
        **bench_harness_tags(),
    )
    return prefix


def bench_harness_tags() -> dict[str, str]:
    """The ``bench`` profile for every role of a bench pattern (``pattern_create`` fields)."""
    tag = bench_profile()
    return {"leader_harness_tag": tag, "maker_harness_tag": tag, "verifier_harness_tag": tag}


def bench_goal_inputs(**spec: Any) -> dict[str, Any]:
    """Trigger inputs whose goal carries ``[bench k=v ...]`` for the model server."""
    return {"spec": "[bench " + " ".join(f"{k}={v}" for k, v in spec.items()) + "]"}


def api_token() -> str:
    """A bearer token of a user with the operator and approver roles (Django set up)."""
    from orchestrator.accounts.roles import Role
    from orchestrator.accounts.services import api_token_create, user_ensure

    user = user_ensure(
        username=f"bench-{uuid.uuid4().hex[:6]}", roles=[Role.OPERATOR, Role.APPROVER]
    )
    return str(api_token_create(user=user, name="bench"))


def service_env(**extra: str) -> dict[str, str]:
    """Environment of the service's processes, from the measuring child's own."""
    keep = (
        "DATABASE_URL",
        "LOOPWRIGHT_VAR_DIR",
        "DJANGO_SETTINGS_MODULE",
        "PYTHONUNBUFFERED",
        "LOOPWRIGHT_HARNESS_PLATFORM",
    )
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(
        CELERY_BROKER_URL=BENCH_REDIS,
        REDIS_URL=BENCH_REDIS,
        LOOPWRIGHT_INVOKER="bench.common.BenchAgentInvoker",
        LOG_LEVEL="WARNING",
    )
    env.update(extra)
    return env


class Service:
    """Model server + one idle worker + the web server (uvicorn), for latency benches."""

    def __init__(self, name: str, *, prefix: str, maker_steps: int, tools: Sequence[str]) -> None:
        self.logs = log_dir(name)
        self.mark_dir = self.logs / "marks"
        self.mark_dir.mkdir()
        self.model = ModelServerProc(self.logs, latency=0.0).start()
        self.pattern = bench_team(
            model_url=self.model.url, maker_steps=maker_steps, tools=tools, prefix=prefix
        )
        env = service_env(LW_BENCH_MARK_DIR=str(self.mark_dir))
        self.worker = worker_proc("worker", env, self.logs).start()
        self.port = free_port()
        self.web = web_proc(env, self.logs, self.port).start()
        wait_for_worker(self.worker)
        wait_http(f"http://127.0.0.1:{self.port}/healthz")
        import httpx2

        self.http = httpx2.Client(
            base_url=f"http://127.0.0.1:{self.port}/api/v1",
            headers={"Authorization": f"Bearer {api_token()}"},
            timeout=60,
        )

    def trigger(self, **spec: Any) -> tuple[str, float, float]:
        """POST the trigger; returns (run id, seconds the API took, monotonic time it returned)."""
        sent = time.monotonic()
        response = self.http.post(
            f"/patterns/{self.pattern}/trigger", json={"inputs": bench_goal_inputs(**spec)}
        )
        returned = time.monotonic()
        if response.status_code != 201:
            raise RuntimeError(f"trigger: {response.status_code} {response.text[:500]}")
        return str(response.json()["id"]), returned - sent, returned

    def close(self) -> None:
        self.http.close()
        for proc in (self.web, self.worker):
            proc.stop()
        self.model.stop()


def wait_status(run_ids: Sequence[Any], statuses: Sequence[str], timeout: float) -> None:
    """Poll until every run is in one of ``statuses`` (Django set up)."""
    from loops.models import LoopRun

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if LoopRun.objects.filter(pk__in=run_ids, status__in=statuses).count() == len(run_ids):
            return
        time.sleep(0.02)
    found = list(LoopRun.objects.filter(pk__in=run_ids).values_list("status", "failure_reason")[:5])
    raise TimeoutError(f"runs not {statuses} after {timeout:g} s: {found}")


# --- the bench invoker (runs inside worker processes) ---------------------------------------------


#: Two no-op tools, called in turn: the loop's repetition guard forces the answer after the
#: same tool was called 7 steps in a row, as it would for a real model.
NOOP_TOOLS = ("bench_noop", "bench_peek")


def noop_tool_for(step: int) -> str:
    return NOOP_TOOLS[step % len(NOOP_TOOLS)]


class NoopTool:
    """A read-effect tool that does nothing: a step costs what the loop costs."""

    def __init__(self, name: str = NOOP_TOOLS[0]) -> None:
        from runtime.types import Effect, ToolSpec

        self.spec = ToolSpec(
            name=name,
            description="Does nothing (benchmark tool).",
            parameters={"type": "object", "properties": {"i": {"type": "integer"}}},
            effect=Effect.READ,
        )

    async def run(self, arguments: dict[str, Any], context: Any) -> Any:
        from runtime.tools import ToolResult

        return ToolResult("ok")


class MarkedWrite:
    """The builtin ``write`` spec (so approvals validate against it) recording when it starts."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec

    async def run(self, arguments: dict[str, Any], context: Any) -> Any:
        started = time.monotonic()
        from runtime.tools import ToolResult

        mark_dir = os.environ.get("LW_BENCH_MARK_DIR")
        if mark_dir:
            run_id = context.idempotency_key.split(":", 1)[0]
            # Written aside, then renamed: the reader never sees a half-written mark.
            part = Path(mark_dir, f"{run_id}.part")
            part.write_text(f"{started!r} {time.time() - (time.monotonic() - started)!r}")
            part.rename(Path(mark_dir, f"{run_id}.start"))
        return ToolResult("written (bench)")


def bench_registry() -> Any:
    from django.conf import settings

    from runtime.tools import (
        DirectoryLedger,
        FileToolConfig,
        ToolRegistry,
        builtin_registry,
    )

    builtins = builtin_registry(FileToolConfig(ledger=DirectoryLedger(settings.VAR_DIR / "ledger")))
    tools: list[Any] = [tool for tool in builtins if tool.spec.name != "write"]
    write = builtins.get("write")
    assert write is not None
    noops = [NoopTool(name) for name in NOOP_TOOLS]
    return ToolRegistry([*tools, *noops, MarkedWrite(write.spec)])


class BenchAgentInvoker:
    """``LOOPWRIGHT_INVOKER`` for bench workers: see the module docstring."""

    @classmethod
    def build(cls) -> Any:
        from loops.worker.invoker import AgentInvoker

        _announce_driver()
        return AgentInvoker(tools=bench_registry())


def _announce_driver() -> None:
    # The driver builds its invoker when it starts (worker_ready): the worker is ready then.
    print("bench-driver-ready", flush=True)


# --- the model server ---------------------------------------------------------------------------

_SPEC = re.compile(r"\[bench (?P<spec>[^\]]*)\]")
PLAN = {"tasks": [{"title": "Do the bench work", "detail": "Call bench_noop as told."}]}
VERDICT = {"verdict": "pass", "reasons": ["bench"], "checks": []}


def goal_spec(body: dict[str, Any]) -> dict[str, str]:
    for message in body.get("messages") or []:
        if message.get("role") == "user":
            found = _SPEC.search(str(message.get("content") or ""))
            if found:
                return dict(p.split("=", 1) for p in found.group("spec").split() if "=" in p)
    return {}


def _message(body: dict[str, Any], spec: dict[str, str]) -> dict[str, Any]:
    wanted = json.dumps(body.get("response_format") or {})
    if '"verdict"' in wanted:
        return {"role": "assistant", "content": json.dumps(VERDICT)}
    if '"tasks"' in wanted:
        return {"role": "assistant", "content": json.dumps(PLAN)}
    made = [
        call["function"]["name"]
        for m in body.get("messages") or []
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or []
    ]
    offered = {t["function"]["name"] for t in body.get("tools") or []}
    call: tuple[str, dict[str, Any]] | None = None
    if len(made) < int(spec.get("steps", "0")) and noop_tool_for(len(made)) in offered:
        call = (noop_tool_for(len(made)), {"i": len(made)})
    elif spec.get("gate") == "1" and "write" not in made and "write" in offered:
        call = ("write", {"path": "bench.txt", "content": "bench\n"})
    if call is None:
        return {"role": "assistant", "content": f"Done after {len(made)} tool calls."}
    wire = {
        "id": f"call_{len(made)}",
        "type": "function",
        "function": {"name": call[0], "arguments": json.dumps(call[1])},
    }
    return {"role": "assistant", "content": None, "tool_calls": [wire]}


def completion_for(body: dict[str, Any]) -> dict[str, Any]:
    """The deterministic bench agent's answer to one chat completion request."""
    message = _message(body, goal_spec(body))
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "bench-model",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


class _ModelServer:
    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.first: dict[str, float] = {}
        self.first_wall: dict[str, float] = {}
        self.arrivals: dict[str, asyncio.Event] = {}
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        arrived = time.monotonic()
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])
        }
        raw = await reader.readexactly(int(headers.get("content-length") or 0))
        if method == "GET" and path.startswith("/bench/first"):
            payload = await self._first(dict(parse_qsl(path.partition("?")[2])))
        elif method == "GET" and path.startswith("/bench/state"):
            payload = {
                "first": self.first,
                "first_wall": self.first_wall,
                "requests": self.requests,
                "max_in_flight": self.max_in_flight,
            }
        else:
            payload = await self._complete(json.loads(raw or b"{}"), arrived)
        data = json.dumps(payload).encode()
        keep = headers.get("connection", "").lower() != "close"
        status = b"200 OK" if payload is not None else b"404 Not Found"
        writer.write(
            b"HTTP/1.1 "
            + status
            + b"\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(data)}\r\n".encode()
            + (b"Connection: keep-alive\r\n\r\n" if keep else b"Connection: close\r\n\r\n")
            + data
        )
        await writer.drain()
        return keep

    async def _first(self, query: dict[str, str]) -> dict[str, float] | None:
        """The first request of run ``tag``, once it has arrived (None: not in ``timeout``)."""
        tag = query["tag"]
        if tag not in self.first:
            arrival = self.arrivals.setdefault(tag, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(arrival.wait(), float(query.get("timeout", 30)))
        if tag not in self.first:
            return None
        return {"at": self.first[tag], "wall": self.first_wall[tag]}

    async def _complete(self, body: dict[str, Any], arrived: float) -> dict[str, Any]:
        self.requests += 1
        tag = goal_spec(body).get("tag")
        if tag and tag not in self.first:
            self.first[tag] = arrived
            self.first_wall[tag] = time.time() - (time.monotonic() - arrived)
            if (waiting := self.arrivals.pop(tag, None)) is not None:
                waiting.set()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.latency > 0:
                await asyncio.sleep(self.latency - (time.monotonic() - arrived))
            return completion_for(body)
        finally:
            self.in_flight -= 1


async def _serve(port: int, latency: float) -> None:
    server = _ModelServer(latency)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", port, backlog=1024)
    print(f"model-server listening on {port}", flush=True)
    async with listener:
        await listener.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.common")
    sub = parser.add_subparsers(dest="command", required=True)
    server = sub.add_parser("model-server", help="the loopback model server")
    server.add_argument("--port", type=int, required=True)
    server.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.port, args.latency))


if __name__ == "__main__":
    main()

"""The sandbox driven by an unprivileged runner, as a production service user would.

The other tests run as root, where every run gets a dedicated host uid. A non-root runner
cannot switch uids: all its sandboxes share its uid on the host, and the limits must still
hold (RLIMIT_NPROC is counted inside each sandbox's user namespace). The module is pure
stdlib, so the system interpreter runs a world-readable copy of it (the checkout itself may
live under a directory the unprivileged user cannot enter, such as /root).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import SandboxConfig

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, os, sys
from sandbox import SandboxConfig, SandboxRequest, probe_backend, run_sandboxed

marker = sys.argv[1]
bomb = '''
import os, time
ok = 0
for _ in range(200):
    try:
        if os.fork() == 0:
            time.sleep(30)
        ok += 1
    except OSError:
        break
print(ok, flush=True)
time.sleep(100)
'''
daemon = f'''
import os, subprocess, time
subprocess.Popen(["/usr/bin/python3", "-c", "import time; time.sleep(1000)", {marker!r}])
time.sleep(1000)
'''
probe = probe_backend(SandboxConfig.from_env())
runs = {
    "env": run_sandboxed(SandboxRequest(language="python", code="import os; print(dict(os.environ))")),
    "bomb": run_sandboxed(SandboxRequest(language="python", code=bomb, timeout_seconds=2)),
    "daemon": run_sandboxed(SandboxRequest(language="python", code=daemon, timeout_seconds=2)),
    "node": run_sandboxed(SandboxRequest(language="node", code="console.log(process.getuid())")),
    "deno": run_sandboxed(SandboxRequest(language="deno", code="console.log(Deno.env.get('HOME'))")),
}
print(json.dumps({
    "euid": os.geteuid(),
    "probe": {"bubblewrap": probe.bubblewrap, "dedicated_uid": probe.dedicated_uid},
    "runs": {name: {"stdout": r.stdout, "stderr": r.stderr[-500:], "exit": r.exit_code,
                    "reason": r.killed_reason, "ms": r.duration_ms,
                    "left": r.leftover_processes, "backend": r.backend}
             for name, r in runs.items()},
}))
"""


@pytest.fixture(scope="module")
def readable_copy() -> Iterator[Path]:
    """``sandbox`` copied where any user can import it."""
    root = Path(tempfile.mkdtemp(prefix="lw-sandbox-pkg-"))
    shutil.copytree(
        REPO / "sandbox", root / "sandbox", ignore=shutil.ignore_patterns("__pycache__")
    )
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield root
    shutil.rmtree(root)


@pytest.fixture(scope="module")
def nonroot_report(readable_copy: Path) -> dict[str, Any]:
    config = SandboxConfig.from_env()
    uid = config.uid_base + config.uid_slots + 10  # outside the slots, owned by nobody
    marker = f"lw-marker-{uuid.uuid4().hex}"
    done = subprocess.run(
        [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            SCRIPT,
            marker,
        ],
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(readable_copy),
            "PYTHONDONTWRITEBYTECODE": "1",
            "LW_CANARY_SECRET": "s3cr3t",
        },
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    report["marker_left"] = _processes_with(marker)
    return report


def _processes_with(needle: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if needle.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


def test_an_unprivileged_runner_gets_bubblewrap_without_dedicated_uids(
    nonroot_report: dict[str, Any],
) -> None:
    assert nonroot_report["euid"] != 0
    assert nonroot_report["probe"] == {"bubblewrap": True, "dedicated_uid": False}
    assert {run["backend"] for run in nonroot_report["runs"].values()} == {"bubblewrap"}


def test_an_unprivileged_runner_still_bounds_a_fork_bomb(nonroot_report: dict[str, Any]) -> None:
    bomb = nonroot_report["runs"]["bomb"]
    assert int(bomb["stdout"]) < 32  # max_processes, counted inside the user namespace
    assert bomb["reason"] == "timeout" and bomb["ms"] <= 3000
    assert bomb["left"] == 0


def test_an_unprivileged_runner_kills_grandchildren_at_the_timeout(
    nonroot_report: dict[str, Any],
) -> None:
    daemon = nonroot_report["runs"]["daemon"]
    assert daemon["reason"] == "timeout" and daemon["left"] == 0
    assert nonroot_report["marker_left"] == []


def test_an_unprivileged_runner_hides_its_environment(nonroot_report: dict[str, Any]) -> None:
    assert "s3cr3t" not in nonroot_report["runs"]["env"]["stdout"]
    assert nonroot_report["runs"]["node"]["stdout"] == "65534\n"
    deno = nonroot_report["runs"]["deno"]  # /opt/loopwright/deno bound in for a non-root uid too
    assert (deno["stdout"], deno["exit"], deno["backend"]) == ("/workdir\n", 0, "bubblewrap")

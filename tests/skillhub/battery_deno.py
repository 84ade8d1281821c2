"""The S1 battery for Deno: the cases behind both walls, and behind bubblewrap's alone.

A ``deno`` run has two walls: Deno's permissions (sandbox/denoargs.py) refuse most attacks
before the kernel sees them, so the battery runs every case twice:

- ``deno``: the runner's own flags. Each case must be contained as for Node.js, and where Deno
  refuses first its ``NotCapable`` error must show (``WALL_CHECKS``).
- ``deno-open``: Deno's wall opened by a test-only interpreter (``open_deno_config``: a wrapper
  that swaps the runner's ``--allow-*`` flags for ``--allow-all``), so the very same programs
  meet bubblewrap, the rlimits and the runner alone, and must be contained by them exactly as
  the Python and Node.js programs are (the default checks). Nothing in production can do this:
  the wrapper is a ``SandboxConfig`` the test builds, not a request field or a setting.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from sandbox import SandboxConfig, SandboxResult
from tests.skillhub.battery_cases import check_timeout
from tests.skillhub.battery_host import Case, Host

Check = Callable[[SandboxResult, Host], list[str]]

#: The cases Deno's permissions refuse before bubblewrap is reached (files, /proc, the network,
#: subprocesses, links); the others (memory, CPU, time, output) only the runner can stop.
DENO_REFUSES_FIRST = (1, 2, 3, 4, 5, 6, 11, 12, 13, 14)

_WRAPPER = """#!/usr/bin/python3 -I
# Test only (tests/skillhub/battery_deno.py): Deno with every permission, bubblewrap's wall
# alone. The runner's --allow-* flags are replaced by --allow-all; the rest is kept.
import os, sys
args = [a for a in sys.argv[1:] if not a.startswith("--allow-")]
os.execv({real!r}, [{real!r}, args[0], "--allow-all", *args[1:]])
"""


@contextlib.contextmanager
def open_deno_config(base: SandboxConfig) -> Iterator[SandboxConfig]:
    """``base`` with Deno's permissions opened (see the module docstring)."""
    folder = Path(tempfile.mkdtemp(prefix="lw-deno-open-"))
    os.chmod(folder, 0o755)  # noqa: S103 (bwrap, as the sandbox uid, binds the wrapper)
    wrapper = folder / "deno-open"
    wrapper.write_text(_WRAPPER.format(real=base.deno_path))
    os.chmod(wrapper, 0o755)  # noqa: S103
    try:
        yield dataclasses.replace(
            base,
            deno_path=str(wrapper),
            extra_ro_binds=(*base.extra_ro_binds, base.deno_path),
        )
    finally:
        wrapper.unlink()
        folder.rmdir()


def _deno_refused(inner: Check) -> Check:
    def check(result: SandboxResult, host: Host) -> list[str]:
        problems = inner(result, host)
        if "NotCapable" not in result.stdout + result.stderr:
            problems.append(f"Deno's permissions did not refuse: {result.stdout[-300:]}")
        return problems

    return check


def _no_subprocess(result: SandboxResult, host: Host) -> list[str]:
    problems = [f"host file created: {path}" for path in host.drop_dir.iterdir()]
    if "uid=" in result.stdout or "NODE-CP-RAN" in result.stdout:
        problems.append(f"a subprocess ran behind Deno's wall: {result.stdout[-300:]}")
    return problems


def wall_checks(defaults: dict[int, Check]) -> dict[int, Check]:
    """The checks of the ``deno`` runs: the default ones, except where Deno's wall makes a
    case's own goal unreachable (11 starts no daemon, 13 runs no shell), plus the
    ``NotCapable`` evidence for every case Deno refuses first."""
    checks = dict(defaults)
    checks[11] = check_timeout
    checks[13] = _no_subprocess
    return {n: _deno_refused(c) if n in DENO_REFUSES_FIRST else c for n, c in checks.items()}


def deno_orphan_case(config: SandboxConfig) -> Case:
    """A Deno program (Deno's wall opened: it must spawn) that starts a detached daemon and
    exits at once: the daemon must die too."""
    marker = f"lw-marker-{uuid.uuid4().hex}"
    code = (
        "new Deno.Command(Deno.execPath(), { args: ['eval', 'setInterval(() => {}, 1e9)', "
        f"{json.dumps(marker)}], detached: true, stdin: 'null', stdout: 'null', "
        "stderr: 'null' }).spawn().unref();\n"
    )

    def check(result: SandboxResult, _host: Host) -> list[str]:
        ok = result.exit_code == 0 and not result.timed_out
        return [] if ok else [f"program failed: {result.exit_code} {result.stderr[-300:]}"]

    return Case(
        number=99,
        language="deno",
        code=code,
        check=check,
        marker=marker,
        variant="-open",
        config=config,
    )

"""The cases of the S1 battery: what each must show (its check), how it is built from its
program, and how the battery runs them all at once."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandbox import (
    Language,
    SandboxConfig,
    SandboxLimits,
    SandboxRequest,
    SandboxResult,
    run_sandboxed_async,
)
from tests.skillhub.battery_host import (
    CONCURRENCY,
    OUTPUT_CAP,
    REPO,
    Case,
    Host,
    Outcome,
    processes_with,
)
from tests.skillhub.battery_programs import NODE_CODE, PY_CODE
from tests.skillhub.battery_programs_deno import DENO_CODE

#: The hostile programs of each language.
PROGRAMS: dict[str, dict[int, str]] = {"python": PY_CODE, "node": NODE_CODE, "deno": DENO_CODE}


def _no_line(result: SandboxResult, prefix: str) -> list[str]:
    bad = [line for line in result.stdout.splitlines() if line.startswith(prefix)]
    return [f"unexpected: {line}" for line in bad]


def _absent(*values: str) -> Callable[[SandboxResult, Host], list[str]]:
    def check(result: SandboxResult, _host: Host) -> list[str]:
        text = result.stdout + result.stderr
        return [f"{value!r} visible to the sandbox" for value in values if value in text]

    return check


def check_read(result: SandboxResult, host: Host) -> list[str]:
    problems = _no_line(result, "READ ")
    if host.canary_text in result.stdout + result.stderr:
        problems.append("canary file content leaked")
    if "root:" in result.stdout:
        problems.append("host /etc/passwd visible")
    if "DONE" not in result.stdout:
        problems.append(f"program did not finish: {result.stderr[-500:]}")
    return problems


def check_write(result: SandboxResult, host: Host) -> list[str]:
    problems = _no_line(result, "WROTE /") + _host_drops(host)
    expected_tmp = [line for line in result.stdout.splitlines() if line.startswith("WROTE-TMP")]
    if not expected_tmp:
        problems.append(f"the private /tmp was not writable: {result.stdout[-300:]}")
    if Path(f"/tmp/lw-escape-{host.canary_dir.name[-8:]}").exists():
        problems.append("a write to the sandbox /tmp reached the host /tmp")
    return problems


def check_network(result: SandboxResult, host: Host) -> list[str]:
    problems = _no_line(result, "CONNECTED")
    refused = [line for line in result.stdout.splitlines() if line.startswith("REFUSED ")]
    if len(refused) != 3:
        problems.append(f"expected 3 refused connections: {result.stdout}{result.stderr[-300:]}")
    if host.listener_hits:
        problems.append(f"loopback listener was reached: {host.listener_hits}")
    return problems


def check_env(result: SandboxResult, host: Host) -> list[str]:
    problems = _absent(host.secret, "LW_CANARY_API_KEY")(result, host)
    if "ENV " not in result.stdout:
        problems.append(f"program did not print its environment: {result.stderr[-300:]}")
    return problems


def check_proc(result: SandboxResult, host: Host) -> list[str]:
    problems = _absent("pytest", "redis-server", "postgres", "loopwright-sbx-", "lw-canary")(
        result, host
    )
    counts = [line for line in result.stdout.splitlines() if line.startswith("PIDS ")]
    if not counts or int(counts[0].split()[1]) > 3:
        problems.append(f"more than the sandbox's own processes visible: {counts}")
    return problems


def check_bounded_processes(limit: int) -> Callable[[SandboxResult, Host], list[str]]:
    def check(result: SandboxResult, _host: Host) -> list[str]:
        counts = [line for line in result.stdout.splitlines() if line.startswith("PROCS ")]
        if not counts:
            return [f"bomb did not report: {result.stdout[-200:]} {result.stderr[-300:]}"]
        fields = counts[0].split()
        seen, failures = int(fields[1]), int(fields[3])
        problems = [] if seen <= limit else [f"{seen} processes > limit {limit}"]
        if failures == 0:
            problems.append("no fork ever failed: the bomb did not reach the limit")
        return problems

    return check


def check_killed(reason: str) -> Callable[[SandboxResult, Host], list[str]]:
    def check(result: SandboxResult, _host: Host) -> list[str]:
        if result.killed_reason != reason:
            return [
                f"killed_reason={result.killed_reason!r}, want {reason!r}: {result.stderr[-400:]}"
            ]
        return []

    return check


def check_timeout(result: SandboxResult, host: Host) -> list[str]:
    problems = check_killed("timeout")(result, host)
    if not result.timed_out:
        problems.append("timed_out is False")
    return problems


def check_daemons_killed(result: SandboxResult, host: Host) -> list[str]:
    problems = check_timeout(result, host)
    counts = [line for line in result.stdout.splitlines() if line.startswith("DAEMONS ")]
    if not counts or int(counts[0].split()[1]) < 2:
        problems.append(f"the detached grandchildren did not start: {result.stdout[-300:]}")
    return problems


def check_stdout_cap(result: SandboxResult, host: Host) -> list[str]:
    problems = check_killed("output_cap")(result, host)
    if len(result.stdout.encode()) != OUTPUT_CAP or not result.stdout_truncated:
        problems.append(f"stdout {len(result.stdout)} bytes, truncated={result.stdout_truncated}")
    return problems


def check_denied_calls(result: SandboxResult, _host: Host) -> list[str]:
    lines = [line for line in result.stdout.splitlines() if line.startswith("CALL ")]
    if len(lines) < 3:
        return [f"too few attempts reported: {result.stdout} {result.stderr[-400:]}"]
    return [f"succeeded: {line}" for line in lines if not line.endswith(" FAILED")]


def check_host_command(result: SandboxResult, host: Host) -> list[str]:
    problems = _host_drops(host)
    if "uid=65534" not in result.stdout:
        problems.append(f"shell did not run as the sandbox user: {result.stdout[-300:]}")
    return problems


def check_symlink(result: SandboxResult, host: Host) -> list[str]:
    problems = _absent(host.canary_text)(result, host)
    for item in result.output_files:
        if item.data is not None and host.canary_text.encode() in item.data:
            problems.append(f"output file {item.name} carried the host canary")
    names = [item.name for item in result.output_files]
    if names != ["real.txt"]:
        problems.append(f"collected {names}, want only the regular file")
    return problems


def _host_drops(host: Host) -> list[str]:
    return [f"host file created: {path}" for path in host.drop_dir.iterdir()]


CHECKS: dict[int, Callable[[SandboxResult, Host], list[str]]] = {
    1: check_read,
    2: check_write,
    3: check_network,
    4: check_env,
    5: check_proc,
    6: check_bounded_processes(SandboxLimits().max_processes),
    7: check_killed("memory"),
    8: check_killed("cpu"),
    9: check_timeout,
    10: check_stdout_cap,
    11: check_daemons_killed,
    12: check_denied_calls,
    13: check_host_command,
    14: check_symlink,
}
TIMEOUTS = {6: 4.0, 9: 2.0, 11: 2.0}
LIMITS = {8: SandboxLimits(cpu_seconds=1)}


def build_case(
    number: int,
    language: Language,
    host: Host,
    *,
    variant: str = "",
    config: SandboxConfig | None = None,
    checks: dict[int, Callable[[SandboxResult, Host], list[str]]] | None = None,
) -> Case:
    """Case ``number`` in ``language``; ``checks`` replace the default checks of some cases."""
    marker = f"lw-marker-{uuid.uuid4().hex}"
    template = PROGRAMS[language][number]
    code = template.format(
        canary=host.lit(host.canary_file),
        canary_dir=host.lit(host.canary_dir),
        drop=host.lit(host.drop_dir),
        repo=host.lit(REPO),
        port=host.listener_port,
        tail=host.lit(host.canary_dir.name[-8:]),
        marker=host.lit(marker),
    )
    return Case(
        number=number,
        language=language,
        code=code,
        check=(checks or {}).get(number, CHECKS[number]),
        timeout=TIMEOUTS.get(number, 10.0),
        limits=LIMITS.get(number, SandboxLimits()),
        collect_outputs="*" if number == 14 else None,
        marker=marker,
        variant=variant,
        config=config,
    )


async def run_case(case: Case, gate: asyncio.Semaphore) -> Outcome:
    request = SandboxRequest(
        language=case.language,
        code=case.code,
        timeout_seconds=case.timeout,
        limits=case.limits,
        output_cap_bytes=OUTPUT_CAP,
        collect_outputs=case.collect_outputs,
    )
    async with gate:
        started = time.monotonic()
        result = await run_sandboxed_async(request, case.config)
        wall = time.monotonic() - started
    # In a thread: a /proc walk on the event loop would delay the other cases' deadlines.
    markers = await asyncio.to_thread(processes_with, case.marker) if case.marker else []
    return Outcome(result=result, wall_seconds=wall, marker_processes=markers)


async def run_battery(cases: list[Case]) -> dict[str, Outcome]:
    gate = asyncio.Semaphore(CONCURRENCY)
    outcomes = await asyncio.gather(*(run_case(case, gate) for case in cases))
    return {case.key: outcome for case, outcome in zip(cases, outcomes, strict=True)}


@dataclass(frozen=True)
class Battery:
    cases: dict[str, Case]
    outcomes: dict[str, Outcome]
    seconds: float
    uid_processes_after: list[int]


def orphan_case(language: Language) -> Case:
    """A program that starts a detached daemon and exits at once: the daemon must die too."""
    marker = f"lw-marker-{uuid.uuid4().hex}"
    code = {
        "python": (
            "import subprocess\n"
            "subprocess.Popen(['/usr/bin/python3', '-c', 'import time; time.sleep(1000)', "
            f"{json.dumps(marker)}], process_group=0)\n"
        ),
        "node": (
            "require('child_process').spawn(process.execPath, ['-e', 'setInterval(() => {}, 1e9)',"
            f" {json.dumps(marker)}], {{ detached: true, stdio: 'ignore' }}).unref();\n"
        ),
    }[language]

    def check(result: SandboxResult, _host: Host) -> list[str]:
        ok = result.exit_code == 0 and not result.timed_out
        return [] if ok else [f"program failed: {result.exit_code} {result.stderr[-300:]}"]

    return Case(number=99, language=language, code=code, check=check, marker=marker)

"""docs/reliability.md S1 for Deno: the 14 cases behind Deno's permissions and bubblewrap, and
the same 14 with Deno's wall opened (bubblewrap, the rlimits and the runner alone), plus the
orphan case; all concurrently, once per module (battery_deno.py explains the two walls)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from sandbox import SandboxConfig
from tests.skillhub.battery_cases import CHECKS, Battery, build_case, run_battery, run_case
from tests.skillhub.battery_deno import (
    DENO_REFUSES_FIRST,
    deno_orphan_case,
    open_deno_config,
    wall_checks,
)
from tests.skillhub.battery_host import TITLES, Host, leaked_sandbox_processes, planted_host

CASE_IDS = [f"{n:02d}-{title}" for n, title in TITLES.items()]
VARIANTS = ["", "-open"]
#: The cases only a wall-clock kill ends (see test_sandbox_battery.py).
WALL_KILLED = (9, 11)
KILL_SLACK_IN_BATTERY = 5.0


@pytest.fixture(scope="module")
def deno_host() -> Iterator[Host]:
    with planted_host() as planted:
        yield planted


@pytest.fixture(scope="module")
def open_config(deno_host: Host) -> Iterator[SandboxConfig]:
    with open_deno_config(SandboxConfig.from_env()) as config:
        yield config


@pytest.fixture(scope="module")
def deno_battery(deno_host: Host, open_config: SandboxConfig) -> Battery:
    walled = wall_checks(CHECKS)
    cases = [build_case(n, "deno", deno_host, checks=walled) for n in TITLES]
    cases += [build_case(n, "deno", deno_host, variant="-open", config=open_config) for n in TITLES]
    cases.append(deno_orphan_case(open_config))
    started = time.monotonic()
    outcomes = asyncio.run(run_battery(cases))
    seconds = time.monotonic() - started
    leftovers = leaked_sandbox_processes(SandboxConfig.from_env())
    print(f"\nS1 Deno battery: {len(cases)} sandboxed runs in {seconds:.1f} s")
    return Battery({c.key: c for c in cases}, outcomes, seconds, leftovers)


@pytest.mark.parametrize("variant", VARIANTS, ids=["both-walls", "bwrap-only"])
@pytest.mark.parametrize("number", list(TITLES), ids=CASE_IDS)
def test_s1_deno_case_is_contained(
    deno_battery: Battery, deno_host: Host, variant: str, number: int
) -> None:
    key = f"deno{variant}-{number:02d}"
    case, outcome = deno_battery.cases[key], deno_battery.outcomes[key]
    result = outcome.result
    problems = case.check(result, deno_host)
    assert result.backend == "bubblewrap"
    assert not problems, f"{key}: {problems}\nstdout: {result.stdout[-800:]}"
    assert result.leftover_processes == 0
    assert outcome.marker_processes == [], "processes with the case's marker survived"
    assert result.duration_ms <= (case.timeout + KILL_SLACK_IN_BATTERY) * 1000


@pytest.mark.parametrize("number", DENO_REFUSES_FIRST)
def test_opened_deno_wall_leaves_deno_permissions_out_of_the_way(
    deno_battery: Battery, number: int
) -> None:
    """The ``-open`` runs really met bubblewrap alone: no Deno permission error anywhere."""
    result = deno_battery.outcomes[f"deno-open-{number:02d}"].result
    assert "NotCapable" not in result.stdout + result.stderr, result.stdout[-500:]


def test_bwrap_alone_runs_a_shell_only_as_the_sandbox_user(deno_battery: Battery) -> None:
    """Case 13 with Deno's wall open: the shell does start, as uid 65534, in no host file."""
    result = deno_battery.outcomes["deno-open-13"].result
    assert "uid=65534" in result.stdout, result.stdout[-500:]


def test_deno_daemon_started_by_a_program_dies_when_it_exits(
    deno_battery: Battery, deno_host: Host
) -> None:
    outcome = deno_battery.outcomes["deno-open-99"]
    assert deno_battery.cases["deno-open-99"].check(outcome.result, deno_host) == []
    assert outcome.marker_processes == []
    assert outcome.result.leftover_processes == 0


def test_no_process_of_any_sandbox_uid_survives_the_deno_battery(deno_battery: Battery) -> None:
    assert deno_battery.uid_processes_after == []


@pytest.mark.parametrize("variant", VARIANTS, ids=["both-walls", "bwrap-only"])
@pytest.mark.parametrize("number", WALL_KILLED, ids=[CASE_IDS[n - 1] for n in WALL_KILLED])
def test_s1_deno_wall_clock_kill_lands_within_a_second_of_the_deadline(
    deno_host: Host, open_config: SandboxConfig, variant: str, number: int
) -> None:
    config = open_config if variant else None
    walled = None if variant else wall_checks(CHECKS)
    case = build_case(number, "deno", deno_host, variant=variant, config=config, checks=walled)
    outcome = asyncio.run(run_case(case, asyncio.Semaphore(1)))
    assert outcome.result.timed_out and outcome.marker_processes == []
    assert outcome.result.duration_ms <= (case.timeout + 1) * 1000


def test_deno_battery_runs_within_a_minute(deno_battery: Battery) -> None:
    assert deno_battery.seconds < 60

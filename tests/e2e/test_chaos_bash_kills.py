"""P7 for ``bash``: workers SIGKILLed while their commands run; every run still ends for a
reason of its own, no completed side effect is repeated, no workspace is left unusable.

docs/reliability.md P7, for the step kind that used to break it (the workspace stayed lent to the
sandbox uid after a kill, git refused it, and the run failed as "the worker stopped 5 times"):

- 100 runs, each leader + maker + verifier through the loopback model server and the
  production AgentInvoker; the maker runs one ``bash`` command (a real sandbox, the run's git
  worktree as its working directory) that sleeps, then makes its effect once per idempotency
  key. Every tenth run is rejected by its verifier: a failure of its own.
- At least 10 SIGKILLs of a worker's whole process group *during* a command: the victim is a
  worker holding a run whose ``bash`` step is started and whose workspace is lent to a sandbox
  uid, and the kill counts only if a hit run's workspace is still lent right after it.
  Each kill is followed by a replacement worker; runs are fed in batches during the chaos.
- Lease 3 s, heartbeat 1 s, the real reaper through ``celery beat`` every second.

Pass criteria: each run ends as its label says (succeeded, or failed ``rejected_by_verifier``),
none failed for a kill or a driver error; each command's effect is in its workspace once, and
a command ran again only in a run a kill hit; one completed ``bash`` step per run; every
workspace is the service user's throughout and git reads it; every workspace a kill left lent
was reclaimed by the next attempt (``workspace.reclaimed``); no worker died unkilled.

The random schedule's seed is printed; set ``LW_CHAOS_SEED`` to replay it.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from loops.models import LoopEvent, LoopRun, LoopStep, RunStatus
from loops.services.runs import run_trigger
from tests.e2e.conftest import start_beat, start_worker
from tests.support.bash_chaos import (
    bash_pattern,
    foreign_entries,
    git_refusal,
    git_repository,
    lent,
    lines,
    script_reply,
    start_approver,
    workspace_of,
)
from tests.support.chaos import leased_by, log_tails, owner_prefix, run_history
from tests.support.model_server import ModelServer
from tests.support.workers import WorkerProcess, wait_for

pytestmark = [
    pytest.mark.one_backend,
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
    pytest.mark.timeout(900),
]

RUNS = 100
#: Runs the feeder may add past RUNS when the kills have not all landed during a command yet.
MAX_RUNS = 200
INITIAL_RUNS = 10
BASH_KILLS = 10
MAX_KILLS = 24
SLEEP = 2.5
FEED_SECONDS = 0.5
VICTIM_WAIT_SECONDS = 15.0
REJECT_EVERY = 10
WORKER_ENV = {
    "LOOPWRIGHT_INVOKER": "loops.worker.invoker.AgentInvoker",
    "LOOPWRIGHT_DRIVER_CAPACITY": "60",
    "LOOPWRIGHT_LEASE_SECONDS": "3",
    "LOOPWRIGHT_HEARTBEAT_SECONDS": "1",
}


@dataclass
class Kill:
    worker: str
    hit: set[uuid.UUID] = field(default_factory=set)
    #: Hit runs whose workspace was still lent to a sandbox uid right after the kill.
    lent: set[uuid.UUID] = field(default_factory=set)


@pytest.fixture
def model() -> Iterator[ModelServer]:
    with ModelServer() as server:
        server.always(script_reply(SLEEP))
        yield server
    server.check()


def _commands_running(prefix: str) -> set[uuid.UUID]:
    """Runs held by this worker whose ``bash`` command is running now (lent workspace)."""
    started = LoopStep.objects.filter(
        kind="tool",
        name="bash",
        status__in=("started", "approved"),  # an approved (gated) call runs as "approved"
        run__lease_owner__startswith=prefix,
    ).values_list("run_id", flat=True)
    return {run_id for run_id in started if lent(workspace_of(run_id))}


def _victim(
    workers: list[WorkerProcess], rng: random.Random, hit_before: set[uuid.UUID]
) -> WorkerProcess | None:
    """A ready worker whose command runs right now, while another is ready to take over;
    one running a command of a run no kill hit yet, when there is one (else the kills would
    follow the few runs they hit first from worker to worker)."""
    ready = [w for w in workers if w.is_ready()]
    if len(ready) < 2:
        return None
    running = {w.name: _commands_running(owner_prefix(w)) for w in ready}
    fresh = [w for w in ready if running[w.name] - hit_before]
    busy = fresh or [w for w in ready if running[w.name]]
    return rng.choice(busy) if busy else None


def _kill(victim: WorkerProcess) -> Kill:
    prefix = owner_prefix(victim)
    kill = Kill(victim.name)
    victim.kill()
    kill.hit |= leased_by(prefix)
    kill.lent = {run_id for run_id in kill.hit if lent(workspace_of(run_id))}
    time.sleep(0.3)  # a claim committed just before the kill may land a moment later
    kill.hit |= leased_by(prefix)
    return kill


class Feeder:
    """Triggers the runs one at a time, every ``FEED_SECONDS``, up to a limit that grows with
    each kill during a command, so there are commands to kill until the last kill."""

    def __init__(self, pattern: Any) -> None:
        self.pattern, self.created, self.limit, self.last = pattern, 0, INITIAL_RUNS, 0.0

    def allow(self, more: int) -> None:
        self.limit = min(MAX_RUNS, self.limit + more)

    def feed(self, *, all_now: bool = False) -> None:
        while self.created < (max(RUNS, self.limit) if all_now else self.limit):
            if not all_now and time.monotonic() - self.last < FEED_SECONDS:
                return
            index = self.created
            label = f"reject-{index}" if index % REJECT_EVERY == 0 else f"run-{index}"
            run_trigger(pattern=self.pattern, actor="operator", inputs={"label": label})
            self.created, self.last = index + 1, time.monotonic()


def _pause(feeder: Feeder, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        feeder.feed()
        time.sleep(0.05)


def _chaos(
    workers: list[WorkerProcess], tmp_path: Path, feeder: Feeder, rng: random.Random
) -> list[Kill]:
    kills: list[Kill] = []
    per_kill = (RUNS - INITIAL_RUNS) // BASH_KILLS
    while sum(1 for k in kills if k.lent) < BASH_KILLS and len(kills) < MAX_KILLS:
        _pause(feeder, rng.uniform(0.5, 2.0))
        waited = idle_since = time.monotonic()
        hit_before = {run_id for kill in kills for run_id in kill.hit}
        while (victim := _victim(workers, rng, hit_before)) is None:
            if (
                feeder.created >= MAX_RUNS
                and time.monotonic() - idle_since > 4 * VICTIM_WAIT_SECONDS
            ):
                # Every run is in, and none runs a command to kill: say why, do not spin.
                raise AssertionError(
                    f"no command to kill for {4 * VICTIM_WAIT_SECONDS:.0f} s after all {MAX_RUNS} "
                    f"runs were fed; {len(kills)} kills so far; ready workers "
                    f"{[w.name for w in workers if w.is_ready()]}; {_summary()}"
                    + log_tails(workers)
                )
            if time.monotonic() - waited > VICTIM_WAIT_SECONDS:
                # Every run fed so far may have ended: let more in.
                feeder.allow(per_kill)
                waited = time.monotonic()
            _pause(feeder, 0.05)
        kills.append(_kill(victim))
        workers.append(WorkerProcess(f"r{len(kills)}", tmp_path, WORKER_ENV).start())
        if kills[-1].lent:
            feeder.allow(per_kill)
    feeder.feed(all_now=True)
    return kills


def test_workers_killed_during_bash_leave_every_run_to_end_for_a_reason_of_its_own(
    workers: list[WorkerProcess],
    procs: list[Any],
    tmp_path: Path,
    clean_broker: None,
    model: ModelServer,
) -> None:
    seed = int(os.environ.get("LW_CHAOS_SEED", random.randrange(1_000_000)))
    print(f"P7 bash chaos seed: {seed} (replay with LW_CHAOS_SEED={seed})")
    rng = random.Random(seed)
    pattern = bash_pattern(
        "bash-chaos",
        model.url,
        git_repository(tmp_path / "repo"),
        # Enough attempts for a run every kill hits; the rejected runs are no breaker test.
        maxAttempts=MAX_KILLS + 2,
        circuitBreaker={"failureThreshold": 50},
    )
    start_approver(procs, pattern)  # bash is high-risk: at L1 a human approves each call
    start_beat(procs, tmp_path, 1.0)
    for name in ("w1", "w2", "w3", "w4"):
        start_worker(workers, tmp_path, name, **WORKER_ENV)
    feeder = Feeder(pattern)

    started = time.monotonic()
    kills = _chaos(workers, tmp_path, feeder, rng)
    ended = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELED)
    wait_for(
        lambda: LoopRun.objects.filter(pattern=pattern, status__in=ended).count() == feeder.created,
        timeout=300,
        interval=0.5,
        message="not every run ended:\n" + _summary() + log_tails([*workers, *procs]),
    )
    hits = Counter(run_id for kill in kills for run_id in kill.hit)
    print(
        f"{len(kills)} kills ({sum(1 for k in kills if k.lent)} during a command), "
        f"{len(hits)} runs hit, {time.monotonic() - started:.0f} s; {_summary()}"
    )
    assert sum(1 for k in kills if k.lent) >= BASH_KILLS, [(k.worker, len(k.lent)) for k in kills]
    _assert_no_worker_died_on_its_own(workers, kills)
    runs = list(LoopRun.objects.filter(pattern=pattern))
    _assert_each_run_ended_for_its_own_reason(runs)
    _assert_effects_once(runs, hits)
    _assert_workspaces_usable(runs, {r for k in kills for r in k.lent})


def _summary() -> str:
    counts = Counter(LoopRun.objects.values_list("status", "terminal_reason"))
    odd = set(
        LoopRun.objects.exclude(
            terminal_reason__in=("", "verified", "rejected_by_verifier")
        ).values_list("failure_reason", flat=True)[:5]
    )
    return f"{counts}; other reasons: {odd}\n"


def _assert_no_worker_died_on_its_own(workers: list[WorkerProcess], kills: list[Kill]) -> None:
    killed = {kill.worker for kill in kills}
    crashed = [w for w in workers if not w.alive() and w.name not in killed]
    assert crashed == [], "workers exited without being killed:\n" + log_tails(crashed)


def _assert_each_run_ended_for_its_own_reason(runs: list[LoopRun]) -> None:
    wrong = []
    for run in runs:
        rejected = str(run.inputs["label"]).startswith("reject")
        expected = (
            (RunStatus.FAILED, "rejected_by_verifier")
            if rejected
            else (RunStatus.SUCCEEDED, "verified")
        )
        if (run.status, run.terminal_reason) != expected:
            wrong.append(run.id)
    assert wrong == [], f"{len(wrong)} runs ended otherwise than their own script says:\n" + (
        "\n".join(run_history(r) for r in wrong[:3])
    )
    errors = LoopEvent.objects.filter(run__in=runs, type="driver.error").count()
    assert errors == 0, "driver errors: " + run_history(
        LoopEvent.objects.filter(type="driver.error").values_list("run_id", flat=True)[0]
    )


def _assert_effects_once(runs: list[LoopRun], hits: Counter[uuid.UUID]) -> None:
    reruns = 0
    for run in runs:
        steps = list(LoopStep.objects.filter(run=run, kind="tool", name="bash"))
        assert [s.status for s in steps] == ["completed"], run_history(run.id)
        key = steps[0].idempotency_key
        workdir = workspace_of(run.id)
        attempts, effects = lines(workdir / "attempts.log"), lines(workdir / "effects.log")
        assert effects == Counter({key: 1}), (effects, run_history(run.id))
        assert set(attempts) == {key}
        # A command runs again only in a run a kill hit (it had not finished: no ledger entry).
        assert attempts[key] <= 1 + hits[run.id], (attempts, hits[run.id], run_history(run.id))
        reruns += attempts[key] - 1
    print(f"commands run again after a kill: {reruns}")


def _assert_workspaces_usable(runs: list[LoopRun], left_lent: set[uuid.UUID]) -> None:
    for run in runs:
        workdir = workspace_of(run.id)
        assert foreign_entries(workdir) == [], run_history(run.id)
        assert git_refusal(workdir) == "", run_history(run.id)
    reclaimed = set(
        LoopEvent.objects.filter(type="workspace.reclaimed").values_list("run_id", flat=True)
    )
    assert left_lent <= reclaimed, [run_history(r) for r in list(left_lent - reclaimed)[:2]]

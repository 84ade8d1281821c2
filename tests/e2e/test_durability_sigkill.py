"""D1: SIGKILL chaos. Every run is reclaimed and finishes; no side effect happens twice.

docs/reliability.md D1, scaled to fit CI (the meaning of each criterion is kept):

- 48 runs (catalogue: 200), each leader + maker + verifier with 5 side-effecting steps of
  0.4 s, so 720 steps; 3 ``celery worker`` processes.
- 6 SIGKILLs (catalogue: 20) of a random busy worker's whole process group at random moments,
  each followed by a replacement worker (booting while the chaos goes on; a kill waits until
  two workers are ready, so a survivor can reclaim). Runs are fed in small batches during the
  chaos, so kills land on runs at every stage.
- Lease 3 s and heartbeat 1 s (catalogue: 30 s and 10 s; same 3:1 ratio). The reaper is the real
  one: ``celery beat`` sends ``loops.reap`` every second to the workers.

Pass criteria as implemented:

- every run ends ``succeeded``;
- each step's side effect happens exactly once: effect rows == distinct attempted keys == 720
  == completed tool steps;
- a step is re-issued only when a kill hit its run: per idempotency key, attempts <= 1 + kills
  that hit the run; in total, attempts - distinct keys <= runs hit, summed over kills. (One kill
  hits every run its worker held, so "total re-issues <= number of kills" would be too strict.)
- every run held by a killed worker is claimed again <= lease TTL + reaper interval + 5 s after
  the kill;
- claims per run <= 1 + kills that hit it (no false reclaims of live runs).

The random schedule's seed is printed; set ``LW_CHAOS_SEED`` to replay it.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from loops.models import LoopRun, LoopStep, RunStatus
from tests.e2e.conftest import start_beat, start_worker
from tests.support.chaos import (
    attempts_per_key,
    claims_per_run,
    effect_rows,
    first_claim_after,
    leased_by,
    log_tails,
    owner_prefix,
    run_history,
)
from tests.support.factories import make_pattern, make_run
from tests.support.workers import WorkerProcess, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

RUNS = 48
INITIAL_RUNS = 12
STEPS = 5
INVOCATIONS = 3  # leader, one maker, verifier
KILLS = 6
LEASE_SECONDS = 3.0
REAPER_SECONDS = 1.0
RECLAIM_SLACK = 5.0
WORKER_ENV = {
    "LW_TEST_STEPS": str(STEPS),
    "LW_TEST_STEP_SLEEP": "0.4",
    "LOOPWRIGHT_DRIVER_CAPACITY": "60",
    "LOOPWRIGHT_LEASE_SECONDS": str(LEASE_SECONDS),
    "LOOPWRIGHT_HEARTBEAT_SECONDS": "1",
}


@dataclass
class Kill:
    worker: str
    at: float  # time.time() just before the signal
    hit: set[uuid.UUID] = field(default_factory=set)


def _pick_victim(workers: list[WorkerProcess], rng: random.Random) -> WorkerProcess:
    """A random ready worker, preferring one that holds runs; waits until at least two are
    ready, so a survivor can reclaim (the bound is about the lease and the reaper, not about
    how long a Celery worker takes to boot on a loaded machine)."""
    wait_for(lambda: sum(w.is_ready() for w in workers) >= 2, timeout=60, message="no workers")
    ready = [w for w in workers if w.is_ready()]
    busy = [w for w in ready if leased_by(owner_prefix(w))]
    return rng.choice(busy or ready)


def _kill(victim: WorkerProcess) -> Kill:
    prefix = owner_prefix(victim)
    kill = Kill(victim.name, time.time())
    victim.kill()
    # A claim whose COMMIT reached the server just before the kill may land a moment later;
    # the dead owner's leases stay put until they expire (>= 2 s), so look twice.
    kill.hit |= leased_by(prefix)
    time.sleep(0.5)
    kill.hit |= leased_by(prefix)
    return kill


def _chaos(workers: list[WorkerProcess], tmp_path: Path, pattern: Any, seed: int) -> list[Kill]:
    """Kill a busy worker at random moments; keep feeding runs so every kill finds work."""
    rng = random.Random(seed)
    kills: list[Kill] = []
    created = INITIAL_RUNS
    for n in range(KILLS):
        time.sleep(rng.uniform(1.0, 3.0))
        kills.append(_kill(_pick_victim(workers, rng)))
        workers.append(WorkerProcess(f"r{n}", tmp_path, WORKER_ENV).start())  # boots meanwhile
        batch = min(RUNS - created, (RUNS - INITIAL_RUNS) // KILLS)
        for _ in range(batch):
            make_run(pattern, max_attempts=KILLS + 2)
            time.sleep(rng.uniform(0.0, 0.3))  # spread them over the workers' polls
        created += batch
    for _ in range(RUNS - created):
        make_run(pattern, max_attempts=KILLS + 2)
    return kills


def _hits_per_run(kills: list[Kill]) -> Counter[uuid.UUID]:
    return Counter(run_id for kill in kills for run_id in kill.hit)


def test_sigkilled_workers_runs_are_reclaimed_and_finish_without_duplicate_effects(
    workers: list[WorkerProcess], procs: list[Any], tmp_path: Path, clean_broker: None
) -> None:
    seed = int(os.environ.get("LW_CHAOS_SEED", random.randrange(1_000_000)))
    print(f"D1 chaos seed: {seed} (replay with LW_CHAOS_SEED={seed})")
    pattern = make_pattern()
    for _ in range(INITIAL_RUNS):
        make_run(pattern, max_attempts=KILLS + 2)
    start_beat(procs, tmp_path, REAPER_SECONDS)
    for name in ("w1", "w2", "w3"):
        start_worker(workers, tmp_path, name, **WORKER_ENV)

    kills = _chaos(workers, tmp_path, pattern, seed)
    wait_for(
        lambda: LoopRun.objects.filter(status=RunStatus.SUCCEEDED).count() == RUNS,
        timeout=180,
        message="not every run succeeded:\n" + _status_summary() + log_tails([*workers, *procs]),
    )

    hits = _hits_per_run(kills)
    print(f"kills: {[(k.worker, len(k.hit)) for k in kills]}; runs hit: {len(hits)}")
    _assert_no_worker_died_on_its_own(workers, kills)
    assert len(kills) == KILLS and sum(len(k.hit) for k in kills) > 0
    claims = claims_per_run()
    too_many = {r: (claims[r], hits[r]) for r in claims if claims[r] > 1 + hits[r]}
    assert too_many == {}, f"runs claimed more often than kills explain: {too_many}\n" + "\n".join(
        run_history(r) for r in list(too_many)[:3]
    )
    _assert_effects_exactly_once(hits)
    _assert_reclaimed_in_time(kills)


def _assert_no_worker_died_on_its_own(workers: list[WorkerProcess], kills: list[Kill]) -> None:
    killed = {kill.worker for kill in kills}
    crashed = [w for w in workers if not w.alive() and w.name not in killed]
    assert crashed == [], "workers exited without being killed:\n" + log_tails(crashed)


def _status_summary() -> str:
    return str(Counter(LoopRun.objects.values_list("status", flat=True))) + "\n"


def _assert_effects_exactly_once(hits: Counter[uuid.UUID]) -> None:
    expected = RUNS * INVOCATIONS * STEPS
    attempts = attempts_per_key()
    effects = effect_rows()
    completed = LoopStep.objects.filter(kind="tool", status="completed").count()
    print(
        f"side effects: {len(effects)} applied, {sum(attempts.values())} attempts "
        f"over {len(attempts)} keys"
    )
    assert len(effects) == len(attempts) == completed == expected
    assert LoopStep.objects.count() == expected  # no step was begun twice under a new seq
    over = {
        key: (n, hits[uuid.UUID(key.split(":")[0])])
        for key, n in attempts.items()
        if n > 1 + hits[uuid.UUID(key.split(":")[0])]
    }
    assert over == {}, f"keys attempted more often than kills explain: {over}\n" + "\n".join(
        run_history(key.split(":")[0]) for key in list(over)[:3]
    )
    assert sum(attempts.values()) - len(attempts) <= sum(hits.values())


def _assert_reclaimed_in_time(kills: list[Kill]) -> None:
    bound = LEASE_SECONDS + REAPER_SECONDS + RECLAIM_SLACK
    latencies = []
    for kill in kills:
        for run_id in kill.hit:
            reclaimed = first_claim_after(run_id, kill.at)
            assert reclaimed is not None, f"run {run_id} hit at {kill.at} was never reclaimed"
            latencies.append(reclaimed - kill.at)
    if latencies:
        print(f"reclaim after kill: max {max(latencies):.2f} s, bound {bound:.1f} s")
        assert max(latencies) <= bound

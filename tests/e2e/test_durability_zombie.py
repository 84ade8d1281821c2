"""D3: a frozen worker (SIGSTOP) loses its runs, and when it wakes up it can write nothing.

docs/reliability.md D3 with real processes. Three runs start on worker ``zombie``. One of them
pauses just before a side effect (the test invoker's ``LW_TEST_HOLD_AT`` hook), and at that
moment the test freezes the zombie's whole process group with SIGSTOP. The zombie stays frozen
for more than 2 x the lease TTL (3 s) and until another worker, started after the freeze, has
reclaimed every run (through the real reaper in ``celery beat``) and finished it. Then SIGCONT.

The zombie wakes up in the middle of its step: it applies its side effect and tries to complete
the step and carry on. Pass criteria as implemented:

- every run finished exactly once: one transition to ``succeeded`` per run;
- the zombie's writes were rejected: no event by the zombie after the takeover claim, no step
  row left with the zombie's lease token that was finished after the takeover, 15 tool steps
  per run (none added by the zombie);
- its side effect was refused by the idempotency key: the held step's key was attempted twice
  (zombie and new owner) and applied once, by the new owner; every key the zombie attempted
  after waking was already applied by someone else; effect rows == distinct keys == 45;
- the zombie saw the lease loss (its log says so) and is still running (nothing crashed).
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from loops.models import LoopEvent, LoopRun, LoopStep, RunStatus
from tests.e2e.conftest import start_beat, start_worker
from tests.support.chaos import (
    attempts_per_key,
    effect_rows,
    leased_by,
    log_tails,
    owner_prefix,
    run_history,
)
from tests.support.factories import make_pattern, make_run
from tests.support.workers import WorkerProcess, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

LEASE_SECONDS = 3.0
RUNS = 3
STEPS_PER_RUN = 15  # leader, maker, verifier x 5
# The frozen zombie may be caught inside a transaction of one of its other runs, holding a row
# the rescuer needs (the pattern's daily usage bucket): PostgreSQL ends that session after this.
BASE_ENV = {
    "LW_TEST_STEPS": "5",
    "LW_TEST_STEP_SLEEP": "0.1",
    "LOOPWRIGHT_DB_IDLE_TX_TIMEOUT_SECONDS": "5",
}


def _max_attempt_id() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(max(id), 0) FROM lw_test_side_effect_attempts")
        return int(cursor.fetchone()[0])


def _attempts_after(attempt_id: int, pid: int) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT idempotency_key FROM lw_test_side_effect_attempts WHERE id > %s AND pid = %s",
            [attempt_id, pid],
        )
        return [str(row[0]) for row in cursor.fetchall()]


def test_a_frozen_worker_is_fenced_off_when_it_wakes_after_a_takeover(
    workers: list[WorkerProcess], procs: list[Any], tmp_path: Path, clean_broker: None
) -> None:
    hold_dir = tmp_path / "hold"
    hold_dir.mkdir()
    pattern = make_pattern()
    runs = [make_run(pattern) for _ in range(RUNS)]
    start_beat(procs, tmp_path, 1.0)
    zombie = start_worker(
        workers, tmp_path, "zombie", **BASE_ENV, LW_TEST_HOLD_AT="maker:0:2",
        LW_TEST_HOLD_DIR=str(hold_dir), LW_TEST_HOLD_SECONDS="3",
    )  # fmt: skip
    zombie_prefix = owner_prefix(zombie)
    wait_for(lambda: len(leased_by(zombie_prefix)) == RUNS, timeout=30, message=log_tails([zombie]))

    wait_for(lambda: any(hold_dir.glob("*.hold")), timeout=60, message=log_tails([zombie]))
    zombie.signal_group(signal.SIGSTOP)
    stopped_at = time.time()
    held = json.loads(next(hold_dir.glob("*.hold")).read_text())
    print(f"zombie frozen holding step {held['key']}")
    time.sleep(0.5)
    held_step = LoopStep.objects.get(run_id=held["run_id"], seq=held["seq"])
    assert held_step.status == "started", "the zombie was not frozen inside its held step"
    try:
        # Started only now: a worker that boots on a loaded machine can take seconds, and the
        # zombie must be frozen inside its held step, not after it.
        rescuer = start_worker(workers, tmp_path, "rescuer", **BASE_ENV)
        wait_for(
            lambda: LoopRun.objects.filter(status=RunStatus.SUCCEEDED).count() == RUNS,
            timeout=90,
            message="runs not finished by the rescuer:\n" + log_tails([*workers, *procs]),
        )
        time.sleep(max(0.0, stopped_at + 2 * LEASE_SECONDS + 1 - time.time()))
        woke_after = _max_attempt_id()
        log_at_wake = len(zombie.log())
    finally:
        zombie.signal_group(signal.SIGCONT)
    print(f"zombie frozen for {time.time() - stopped_at:.1f} s")

    try:
        wait_for(
            lambda: (
                attempts_per_key().get(held["key"], 0) >= 2
                and "lease" in zombie.log()[log_at_wake:]
            ),
            # A thawed process on a loaded 2-core machine (another e2e test's workers beside
            # it) can take tens of seconds to be scheduled through its backlog.
            timeout=90,
        )
    except TimeoutError:
        zombie.signal(signal.SIGUSR1)  # Celery logs every thread's stack on SIGUSR1
        time.sleep(1)
        raise AssertionError(
            f"the zombie did not wake up and try; attempts {attempts_per_key().get(held['key'])}\n"
            + log_tails([zombie], chars=12000)
            + run_history(held["run_id"])
        ) from None
    time.sleep(2)  # let it run into the fence everywhere it was
    assert zombie.alive(), log_tails([zombie])

    for run in runs:
        _assert_fenced(run.id, zombie_prefix)
    _assert_side_effect_refused(held, zombie.pid, rescuer.pid, woke_after)


def _assert_fenced(run_id: uuid.UUID, zombie_prefix: str) -> None:
    history = run_history(run_id)
    events = list(LoopEvent.objects.filter(run_id=run_id).order_by("seq"))
    assert [e.to_status for e in events].count(RunStatus.SUCCEEDED) == 1, history
    claims = [e for e in events if e.type == "lease.claimed"]
    assert claims[0].actor.startswith(zombie_prefix), history
    takeovers = [c for c in claims if not c.actor.startswith(zombie_prefix)]
    assert takeovers, "no other worker took the run over\n" + history
    takeover = takeovers[0]
    by_zombie = [e.seq for e in events if e.actor.startswith(zombie_prefix)]
    assert max(by_zombie) < takeover.seq, history

    zombie_token = claims[0].data["token"]
    steps = list(LoopStep.objects.filter(run_id=run_id))
    assert len(steps) == STEPS_PER_RUN, history
    assert all(s.status == "completed" for s in steps), history
    late = [
        s.seq
        for s in steps
        if s.lease_token == zombie_token and s.finished_at and s.finished_at >= takeover.created_at
    ]
    assert late == [], history


def _assert_side_effect_refused(
    held: dict[str, Any], zombie_pid: int, rescuer_pid: int, woke_after: int
) -> None:
    attempts = attempts_per_key()
    effects = {key: pid for key, _run, pid in effect_rows()}
    assert len(effects) == len(attempts) == RUNS * STEPS_PER_RUN
    assert attempts[held["key"]] == 2
    assert effects[held["key"]] == rescuer_pid  # the new owner's effect stands
    late = _attempts_after(woke_after, zombie_pid)
    print(f"zombie attempted {len(late)} side effect(s) after waking: {late}")
    assert held["key"] in late
    assert all(effects[key] != zombie_pid for key in late)

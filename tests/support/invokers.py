"""A scripted invoker for the engine's tests: every step calls a side-effecting "tool" that
records into two raw tables — ``lw_test_side_effects`` (UNIQUE idempotency key: the effect
happens at most once) and ``lw_test_side_effect_attempts`` (every call, so duplicates are
counted, not hidden). It is test-only and never offered to users."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from django.db import connection, transaction

from runtime.invocation import (
    InvocationOutcome,
    InvocationRequest,
    LoopRole,
    NothingToPrepare,
    OutcomeKind,
    StepJournal,
)

TABLES = ("lw_test_side_effects", "lw_test_side_effect_attempts")


def create_side_effect_tables() -> None:
    pk = (
        "BIGSERIAL PRIMARY KEY"
        if connection.vendor == "postgresql"
        else "INTEGER PRIMARY KEY AUTOINCREMENT"
    )
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"DROP TABLE IF EXISTS {table}")
        cursor.execute(
            "CREATE TABLE lw_test_side_effects (idempotency_key VARCHAR(200) PRIMARY KEY, "
            "run_id VARCHAR(64) NOT NULL, pid INTEGER NOT NULL)"
        )
        cursor.execute(
            f"CREATE TABLE lw_test_side_effect_attempts (id {pk}, idempotency_key VARCHAR(200) NOT NULL, "
            "run_id VARCHAR(64) NOT NULL, pid INTEGER NOT NULL)"
        )


def record_side_effect(key: str, run_id: str) -> bool:
    """Log the attempt and apply the effect once; returns False when the key was already used."""
    ignore = "ON CONFLICT DO NOTHING" if connection.vendor == "postgresql" else ""
    insert = "INSERT OR IGNORE" if connection.vendor == "sqlite" else "INSERT"
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO lw_test_side_effect_attempts (idempotency_key, run_id, pid) VALUES (%s, %s, %s)",
            [key, run_id, os.getpid()],
        )
        cursor.execute(
            f"{insert} INTO lw_test_side_effects (idempotency_key, run_id, pid) VALUES (%s, %s, %s) {ignore}",
            [key, run_id, os.getpid()],
        )
        return cursor.rowcount == 1


def side_effect_counts() -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM lw_test_side_effects")
        effects = cursor.fetchone()[0]
        cursor.execute(
            "SELECT count(*), count(DISTINCT idempotency_key) FROM lw_test_side_effect_attempts"
        )
        attempts, keys = cursor.fetchone()
    return {"effects": int(effects), "attempts": int(attempts), "attempted_keys": int(keys)}


class SideEffectInvoker(NothingToPrepare):
    """Each invocation performs ``LW_TEST_STEPS`` side-effecting steps, resuming from the journal."""

    def __init__(self) -> None:
        self.steps = int(os.environ.get("LW_TEST_STEPS", "3"))
        self.sleep = float(os.environ.get("LW_TEST_STEP_SLEEP", "0.02"))
        self.verdict = os.environ.get("LW_TEST_VERDICT", "pass")

    async def invoke(
        self, request: InvocationRequest, journal: StepJournal, prepared: Any = None
    ) -> InvocationOutcome:
        done = await journal.steps()
        finished = {s.request.get("i") for s in done if s.status == "completed"}
        started = {s.request.get("i"): s.seq for s in done if s.status == "started"}
        for i in range(self.steps):
            if i in finished:
                continue  # a completed tool call is never re-run
            seq = started.get(i)
            if seq is None:
                seq = await journal.begin(kind="tool", name="side_effect", request={"i": i})
            key = journal.idempotency_key(seq)
            # One thread holds (when asked) and applies: an effect under way is not undone by
            # the driver cancelling this coroutine, just as a real request already sent is not.
            applied = await asyncio.to_thread(_hold_then_record, request, i, seq, key)
            await asyncio.sleep(self.sleep)
            await journal.complete(seq, response={"applied": applied, "key": key})
        return InvocationOutcome(kind=OutcomeKind.COMPLETED, output=self._output(request.role))

    def _output(self, role: LoopRole) -> dict[str, Any]:
        if role == LoopRole.LEADER:
            return {"tasks": [{"title": "do it"}]}
        if role == LoopRole.VERIFIER:
            return {"verdict": self.verdict, "reasons": ["scripted"], "checks": []}
        return {"summary": "done"}


def _maybe_hold(request: InvocationRequest, i: int, seq: int, key: str) -> None:
    """Pause once per run just before one chosen side effect, so a test can freeze the worker
    (SIGSTOP) in the window between "step persisted as started" and "effect applied".

    ``LW_TEST_HOLD_AT=<invocation>:<step index>`` picks the step, ``LW_TEST_HOLD_DIR`` receives
    one marker file per run (its creation is atomic, so only the first worker to reach the step
    holds), ``LW_TEST_HOLD_SECONDS`` is the pause.
    """
    hold_at, hold_dir = os.environ.get("LW_TEST_HOLD_AT"), os.environ.get("LW_TEST_HOLD_DIR")
    if not hold_at or not hold_dir or hold_at != f"{request.invocation}:{i}":
        return
    info = {"run_id": str(request.run_id), "seq": seq, "key": key, "pid": os.getpid()}
    fd, tmp = tempfile.mkstemp(dir=hold_dir, suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(info, handle)
    try:
        os.link(tmp, Path(hold_dir) / f"{request.run_id}.hold")
    except FileExistsError:
        return  # another worker already held this run once
    finally:
        os.unlink(tmp)
    time.sleep(float(os.environ.get("LW_TEST_HOLD_SECONDS", "3")))


def _hold_then_record(request: InvocationRequest, i: int, seq: int, key: str) -> bool:
    try:
        _maybe_hold(request, i, seq, key)
        return record_side_effect(key, str(request.run_id))
    finally:
        connection.close()

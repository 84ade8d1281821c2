"""A run waiting for a path lock, polled by real claims (``run_claim``) and the real engine
(``drive_run``, an invoker that finishes each role at once), the worker's clock set by
time-machine. Tests using :func:`poll` set ``LOCK_RETRY_SECONDS`` to 0 (each poll due at once)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import time_machine
from asgiref.sync import async_to_sync, sync_to_async

from loops.models import LoopRun, RunStatus
from loops.services.claims import run_claim
from loops.services.locks import path_locks_acquire
from loops.worker.engine import drive_run
from runtime.invocation import (
    InvocationOutcome,
    InvocationRequest,
    LoopRole,
    NothingToPrepare,
    OutcomeKind,
    StepJournal,
)
from tests.support.factories import make_pattern, make_run

T = TypeVar("T")
REPO = {"repositoryKey": "repo", "repositoryRoot": "", "baseRef": "main"}


class _Instant(NothingToPrepare):
    """Every role finishes at once with an output its role accepts."""

    async def invoke(
        self, request: InvocationRequest, journal: StepJournal, prepared: Any = None
    ) -> InvocationOutcome:
        output: dict[str, Any] = {"summary": "done"}
        if request.role == LoopRole.LEADER:
            output = {"tasks": [{"title": "do it"}]}
        elif request.role == LoopRole.VERIFIER:
            output = {"verdict": "pass", "reasons": ["scripted"], "checks": []}
        return InvocationOutcome(kind=OutcomeKind.COMPLETED, output=output)


class _Host:
    """The engine's host: its database calls go back to the test's thread and connection (so
    the exact path's test transaction sees them), its invoker is instant."""

    invoker = _Instant()

    async def db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await sync_to_async(fn, thread_sensitive=True)(*args, **kwargs)


def poll(run: LoopRun, at: datetime) -> str:
    """One claim of ``run`` by a worker whose clock reads ``at``, driven by the engine;
    returns the run's status afterwards."""
    with time_machine.travel(at, tick=False):
        [claim] = run_claim(owner="w1", lease_seconds=60, run_id=run.id)
        async_to_sync(drive_run)(_Host(), claim)
    return str(LoopRun.objects.values_list("status", flat=True).get(pk=run.id))


def held_and_waiting(**policy: Any) -> tuple[LoopRun, LoopRun]:
    """A run holding ``src`` and a run that wants ``src/app.py`` of the same repository."""
    pattern = make_pattern()
    holder = make_run(pattern, status=RunStatus.RUNNING)
    assert path_locks_acquire(run_id=holder.id, repository_key="repo", paths=["src"]) == []
    waiter = make_run(
        pattern,
        repository_snapshot={**REPO, "actingOn": ["src/app.py"]},
        policy_snapshot=policy,
    )
    return holder, waiter

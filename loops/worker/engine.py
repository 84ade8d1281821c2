"""What a worker does with a claimed run: prepare, then leader → makers → verifier.

The run's ``cursor`` records which invocation comes next and what earlier ones produced; it is
written (fenced) after each invocation completes, so a reclaimed run continues where it
stopped, and within an invocation the journal's persisted steps carry it further.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import InterfaceError, OperationalError, transaction
from django.utils import timezone

from loops import db
from loops.models import LoopArtifact, LoopRun, RunStatus, StepStatus
from loops.roles import PLAN_SCHEMA, VERDICT_SCHEMA, judge_verdict
from loops.services import budgets, claim_sql, tool_repeats
from loops.services import steps as step_services
from loops.services.approvals import approval_authorize_execution, approvals_open
from loops.services.claims import Claimed
from loops.services.locks import path_locks_acquire
from loops.services.transitions import Lease, run_transition, run_update_fenced
from loops.services.workspaces import WorkspaceError, workspace_diff, workspace_ensure
from loops.worker.recovery import reclaim_workspace
from runtime.invocation import (
    InvocationOutcome,
    InvocationRequest,
    LeaseLost,
    LoopRole,
    OutcomeKind,
    RecordedCall,
    RetryLater,
    RunHalted,
    StepRecord,
    ToolCallRefused,
)

if TYPE_CHECKING:
    from loops.worker.driver import RunDriver

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class RunState:
    """What the engine needs from the run row, loaded once per claim."""

    id: uuid.UUID
    status: str
    goal: str
    inputs: dict[str, Any]
    autonomy_level: str
    role_bindings: dict[str, Any]
    harness_snapshots: dict[str, Any]
    policy: dict[str, Any]
    repository: dict[str, Any]
    cursor: dict[str, Any] = field(default_factory=dict)
    lock_wait_since: Any = None
    #: The run's limits as last read from the database (with their fingerprint), which lets
    #: an invocation start in one statement that proves them unchanged; None: not known.
    limits: budgets.RunLimits | None = None


def run_state_of(run_id: uuid.UUID, status: str, columns: dict[str, Any]) -> RunState:
    """The state of a run from the columns its claim returned (``claim_sql.RUN_COLUMNS``)."""
    pattern_id, snapshot, pattern_policy = columns[claim_sql.LIMIT_TEXTS]
    return RunState(
        id=run_id,
        status=status,
        goal=columns["goal"],
        inputs=columns["inputs"],
        autonomy_level=columns["autonomy_level"],
        role_bindings=columns["role_bindings"],
        harness_snapshots=columns["harness_snapshots"],
        policy=columns["policy_snapshot"],
        repository=columns["repository_snapshot"],
        cursor=dict(columns["cursor"] or {}),
        lock_wait_since=columns["lock_wait_since"],
        limits=budgets.limits_from_row(run_id, pattern_id, snapshot, pattern_policy),
    )


def load_run_state(run_id: uuid.UUID) -> RunState:
    run = LoopRun.objects.get(pk=run_id)
    return RunState(
        id=run.id,
        status=run.status,
        goal=run.goal,
        inputs=run.inputs,
        autonomy_level=run.autonomy_level,
        role_bindings=run.role_bindings,
        harness_snapshots=run.harness_snapshots,
        policy=run.policy_snapshot,
        repository=run.repository_snapshot,
        cursor=dict(run.cursor or {}),
        lock_wait_since=run.lock_wait_since,
    )


class DbJournal:
    """The engine's :class:`StepJournal`: every write fenced by the lease.

    A model step is numbered here and written with the journal's next write, in the same
    transaction: with the first call it made (``tool_step_begin(model_step=…)``), or on its
    own before anything else is written (:meth:`flush`; the engine flushes when the invocation
    returns). Its calls therefore never start before it is persisted, and a step costs one
    transaction fewer. Only the lease holder writes a run's steps, so the journal knows the
    next seq; the write also checks it (``JournalOutOfStep``)."""

    def __init__(self, driver: RunDriver, lease: Lease, role: LoopRole, invocation: str) -> None:
        self.driver, self.lease, self.role, self.invocation = driver, lease, role, invocation
        #: Tool-loop warnings of the steps this journal began, for the model (``tool_notice``).
        self.notices: dict[int, str] = {}
        #: Until when model calls need no admission (no metered limit bound the run).
        self._unmetered_until = 0.0
        #: The invocation was just started: it has no steps to read back.
        self._fresh = False
        #: When the tool steps this journal began started (step_complete's one-UPDATE path).
        self._began: dict[int, Any] = {}
        #: The run's step count as this journal last wrote it (None: not known, no numbering).
        self._steps: int | None = None
        #: A recorded model step not written yet, and the write that carries it.
        self._pending: step_services.ModelStep | None = None
        self._writing: asyncio.Future[None] | None = None
        #: The run's rule for reads as of the latest write, and its calls so far by hash
        #: (None: not known; every read is then begun before it runs).
        self._rule: step_services.ReadRule | None = None
        self._calls: dict[str, int] | None = None
        #: The read of the invocation's steps, begun early (:meth:`read_steps_early`).
        self._early_steps: asyncio.Future[list[StepRecord]] | None = None

    def read_steps_early(self) -> None:
        """Begin reading the invocation's steps now, while its start is counted: a resumed
        invocation replays them, and the read then adds no time of its own (it made a resume
        slower the longer the run's history). Only the lease holder writes a run's steps, and
        it holds the lease from the claim on, so this reads what :meth:`steps` would; a lost
        lease fails the start (LeaseLost) before anything read is used."""
        self._early_steps = asyncio.ensure_future(self._read_steps())

    def steps_read(self, records: list[StepRecord]) -> None:
        """The invocation's steps, already read (with the claim: ``with_resume_steps``)."""
        self._early_steps = asyncio.get_running_loop().create_future()
        self._early_steps.set_result(records)

    def forget_early_steps(self) -> None:
        """The invocation ended without asking for its steps: drop the early read."""
        early, self._early_steps = self._early_steps, None
        if early is not None:
            _abandon(early)

    async def db_call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` on the driver's database threads (pooled connections): for an invoker's
        own reads, such as the employee's profile."""
        return await self.driver.db(fn, *args, **kwargs)

    def started(
        self,
        *,
        fresh: bool,
        metered: bool,
        steps: int | None = None,
        limits: budgets.RunLimits | None = None,
        calls: dict[str, int] | None = None,
    ) -> None:
        """What the invocation's start found: a ``fresh`` invocation has no steps yet (none is
        written before its start is counted); an unmetered run needs no admission for now;
        ``steps`` is the run's step count, from which the journal numbers model steps;
        ``limits`` and ``calls`` (the run's tool calls by hash) say which reads may run before
        they are persisted (:meth:`runs_first`)."""
        self._fresh = fresh
        self._steps = steps
        self._rule = None if limits is None else step_services.read_rule(limits)
        self._calls = calls
        if not metered:
            self._unmetered_until = time.monotonic() + budgets.ADMISSION_RECHECK_SECONDS

    @property
    def limits(self) -> budgets.RunLimits | None:
        """The run's limits as of the journal's latest write (None: not known)."""
        return None if self._rule is None else self._rule.limits

    def runs_first(self, name: str, request: dict[str, Any]) -> bool:
        """May this read-effect call run before anything of it is persisted? Only when, as of
        the journal's latest write, no limit must judge it first (see :class:`ReadRule`); the
        write that follows (:meth:`record_call`) judges it again, exactly."""
        if self._rule is None or self._calls is None or self._steps is None:
            return False
        return self._rule.runs_first(name, self._calls.get(_digest(name, request), 0) + 1)

    def _counted(self, name: str, request: dict[str, Any]) -> None:
        """A tool step of this call was persisted (the tool-loop policy counts it)."""
        if self._calls is not None:
            digest = _digest(name, request)
            self._calls[digest] = self._calls.get(digest, 0) + 1

    def _saw(self, seq: int) -> None:
        if self._steps is not None:
            self._steps = max(self._steps, seq)

    async def flush(self) -> None:
        """Write the pending model step (if any) and wait for a write carrying it to end."""
        pending, self._pending = self._pending, None
        if pending is not None:
            write = self.driver.db(step_services.model_step_write, self.lease, pending)
            _, self._rule = await self._carrying(write)
        while self._writing is not None:
            await asyncio.shield(self._writing)

    async def _carrying(self, write: Awaitable[T]) -> T:
        """Run a write that carries the pending model step; other writes wait for it."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._writing = done
        try:
            return await write
        finally:
            self._writing = None
            done.set_result(None)

    async def steps(self) -> list[StepRecord]:
        await self.flush()
        early, self._early_steps = self._early_steps, None
        if self._fresh:
            self._fresh = False
            if early is not None:
                _abandon(early)
            return []
        return await (early if early is not None else self._read_steps())

    async def _read_steps(self) -> list[StepRecord]:
        return await self.driver.db(
            step_services.steps_of_invocation, self.lease.run_id, self.invocation
        )

    async def begin(
        self, *, kind: str, name: str, request: dict[str, Any], idempotency_key: str = ""
    ) -> int:
        if kind == "tool":
            return await self._tool_start(name, request, idempotency_key, StepStatus.STARTED)
        await self.flush()
        seq = await self.driver.db(
            step_services.step_begin,
            self.lease,
            role=self.role.value,
            invocation=self.invocation,
            kind=kind,
            name=name,
            request=request,
            idempotency_key=idempotency_key,
        )
        self._saw(seq)
        return seq

    async def gate(
        self, *, name: str, request: dict[str, Any], idempotency_key: str, reason: str
    ) -> int:
        return await self._tool_start(
            name, {**request, "gate_reason": reason}, idempotency_key, StepStatus.GATED
        )

    async def _tool_start(
        self, name: str, request: dict[str, Any], idempotency_key: str, status: StepStatus
    ) -> int:
        """A tool call under the run's limits: refused (ToolCallRefused), stopped (RunHalted),
        or begun, possibly with a notice for its result. The first call of a model step
        carries that step's write."""
        pending, self._pending = self._pending, None
        if pending is None:
            await self.flush()
        write = self.driver.db(
            step_services.tool_step_begin,
            self.lease,
            role=self.role.value,
            invocation=self.invocation,
            name=name,
            request=request,
            idempotency_key=idempotency_key,
            status=status,
            model_step=pending,
            expected=self._rule,
        )
        start = await (self._carrying(write) if pending is not None else write)
        self._wrote(start, name, request)
        if start.refused:
            raise ToolCallRefused(start.refused, seq=start.seq)
        if start.notice:
            self.notices[start.seq] = start.notice
        if start.started_at is not None:
            self._began[start.seq] = start.started_at
        return start.seq

    def _wrote(self, start: step_services.ToolStart, name: str, request: dict[str, Any]) -> None:
        """A tool step was persisted: its seq, its count, and the run's rule for reads."""
        self._saw(start.seq)
        self._counted(name, request)
        self._rule = start.rule

    async def record_call(
        self,
        *,
        name: str,
        request: dict[str, Any],
        idempotency_key: str,
        response: Any,
        error: str = "",
        started_at: datetime | None = None,
    ) -> RecordedCall:
        """A read-effect call that already ran: written completed, with the pending model step
        (the whole tool-loop step in one transaction)."""
        pending, self._pending = self._pending, None
        if pending is None:
            await self.flush()
        write = self.driver.db(
            step_services.tool_step_record,
            self.lease,
            role=self.role.value,
            invocation=self.invocation,
            name=name,
            request=request,
            idempotency_key=idempotency_key,
            response=response,
            error=error,
            started_at=started_at or timezone.now(),
            model_step=pending,
            expected=self._rule,
        )
        start = await (self._carrying(write) if pending is not None else write)
        self._wrote(start, name, request)
        if start.refused:
            raise ToolCallRefused(start.refused, seq=start.seq)
        if start.started_at is None:
            return RecordedCall(start.seq)
        # Begun by the exact path: the caller completes it, with the run's notice if any.
        if start.notice:
            self.notices[start.seq] = start.notice
        self._began[start.seq] = start.started_at
        return RecordedCall(start.seq, completed=False)

    async def admit_model_call(self) -> None:
        await self.flush()
        # A run no tokens/cost limit binds needs no admission: skip the round trip, asking
        # again at least every ADMISSION_RECHECK_SECONDS (a daily limit may appear).
        if self._unmetered_until > time.monotonic():
            return
        while True:
            admission = await self.driver.db(budgets.budget_admission, self.lease)
            if admission.wait is None:
                break
            await asyncio.sleep(admission.wait)
        if not admission.metered:
            self._unmetered_until = time.monotonic() + budgets.ADMISSION_RECHECK_SECONDS

    def tool_notice(self, seq: int) -> str:
        return self.notices.get(seq, "")

    async def authorize(self, seq: int, name: str, arguments: dict[str, Any]) -> str:
        await self.flush()
        return await self.driver.db(
            approval_authorize_execution, self.lease, seq=seq, name=name, arguments=arguments
        )

    async def complete(
        self,
        seq: int,
        *,
        response: Any,
        error: str = "",
        tokens_in: int = 0,
        tokens_out: int = 0,
        cost: float = 0.0,
    ) -> None:
        await self.flush()
        await self.driver.db(
            step_services.step_complete,
            self.lease,
            seq,
            response=response,
            error=error,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost=cost,
            started_at=self._began.pop(seq, None),
        )

    async def record(
        self,
        *,
        kind: str,
        name: str,
        request: dict[str, Any],
        response: Any,
        error: str = "",
        tokens_in: int = 0,
        tokens_out: int = 0,
        cost: float = 0.0,
        duration_ms: int | None = None,
    ) -> int:
        fields = {
            "role": self.role.value,
            "invocation": self.invocation,
            "kind": kind,
            "name": name,
            "request": request,
            "response": response,
            "error": error,
            "tokens_in": tokens_in,
            "tokens_out": tokens_out,
            "cost": cost,
            "duration_ms": duration_ms,
        }
        await self.flush()
        if kind == "model" and self._steps is not None:
            # Numbered now, written with the next write (see the class docstring).
            seq = self._steps + 1
            self._pending = step_services.finished_step(self.lease, seq=seq, **fields)
            self._steps = seq
            return seq
        seq = await self.driver.db(step_services.step_record, self.lease, **fields)
        self._saw(seq)
        if kind == "tool":
            self._counted(name, request)
        return seq

    async def event(self, type: str, data: dict[str, Any]) -> None:
        await self.flush()
        await self.driver.db(step_services.step_event, self.lease, type=type, data=data)

    def idempotency_key(self, step_seq: int, call_index: int = 0) -> str:
        return f"{self.lease.run_id}:{step_seq}:{call_index}"


def _digest(name: str, request: dict[str, Any]) -> str:
    """The tool-loop policy's hash of a call, as the step services compute it."""
    return tool_repeats.call_hash(name, tool_repeats.arguments_of(request))


# --- preparation -----------------------------------------------------------------------------


def prepare(lease: Lease, run: RunState, lock_retry_seconds: float) -> str:
    """Take the path locks and move to running/verifying, or park in waiting_lock.

    Returns the status the run is in afterwards (a run its claim already started is left
    as it is).
    """
    if run.status in (RunStatus.RUNNING.value, RunStatus.VERIFYING.value):
        return run.status
    repo_key = run.repository.get("repositoryKey") or ""
    paths = list(run.repository.get("actingOn") or [])
    if repo_key and paths:
        conflicts = path_locks_acquire(run_id=run.id, repository_key=repo_key, paths=paths)
        if conflicts:
            return _park_for_lock(lease, run, conflicts, lock_retry_seconds)
    target = RunStatus.VERIFYING if run.cursor.get("phase") == "verifier" else RunStatus.RUNNING
    fields: dict[str, Any] = {}
    if "workdir" not in run.cursor:
        try:
            run.cursor["workdir"] = workspace_ensure(run.id, run.repository)
        except WorkspaceError as exc:
            return _fail_for_workspace(lease, run, exc)
        fields["cursor"] = run.cursor
    run_transition(
        run_id=run.id,
        to=target,
        actor=lease.owner,
        lease=lease,
        event_type="run.started",
        fields=fields,
        data={"workdir": run.cursor["workdir"]} if fields else {},
    )
    return target.value


def _park_for_lock(
    lease: Lease, run: RunState, conflicts: list[dict[str, str]], retry_seconds: float
) -> str:
    now = timezone.now()
    since = run.lock_wait_since or now
    limit = int(run.policy.get("lockWaitTimeoutSeconds", 3600))
    if (now - since).total_seconds() > limit:
        run_transition(
            run_id=run.id,
            to=RunStatus.FAILED,
            actor=lease.owner,
            lease=lease,
            event_type="lock.timeout",
            data={"conflicts": conflicts},
            fields={
                "terminal_reason": "lock_wait_timeout",
                "failure_reason": f"Waited more than {limit} s for path locks held by other runs.",
            },
        )
        return RunStatus.FAILED.value
    run_transition(
        run_id=run.id,
        to=RunStatus.WAITING_LOCK,
        actor=lease.owner,
        lease=lease,
        event_type="lock.waiting",
        data={"conflicts": conflicts},
        fields={"not_before": db.time_in(retry_seconds), "lock_wait_since": since},
    )
    return RunStatus.WAITING_LOCK.value


# --- invocations -------------------------------------------------------------------------------


def _next_invocation(run: RunState) -> tuple[LoopRole, str, str] | None:
    """(role, invocation name, employee) of what comes next, or None when all is done."""
    return _next_invocation_of(run.cursor, run.role_bindings)


def _next_invocation_of(
    cursor: dict[str, Any], bindings: dict[str, Any]
) -> tuple[LoopRole, str, str] | None:
    """What comes next by a run's cursor and role bindings (as :func:`_next_invocation`)."""
    phase = cursor.get("phase", "leader")
    if phase == "leader":
        return LoopRole.LEADER, "leader", bindings["leader"]
    if phase == "makers":
        index = int(cursor.get("maker_index", 0))
        makers = list(bindings.get("makers") or [])
        if index < len(makers):
            return LoopRole.MAKER, f"maker:{index}", makers[index]
        return LoopRole.VERIFIER, "verifier", bindings["verifier"]
    if phase == "verifier":
        return LoopRole.VERIFIER, "verifier", bindings["verifier"]
    return None


def _harness_for(run: RunState, role: LoopRole, employee: str) -> dict[str, Any]:
    snaps = run.harness_snapshots or {}
    if role == LoopRole.MAKER:
        return dict((snaps.get("makers") or {}).get(employee) or {})
    return dict(snaps.get(role.value) or {})


def _advance_cursor(run: RunState, role: LoopRole, output: dict[str, Any]) -> dict[str, Any]:
    cursor = dict(run.cursor)
    if role == LoopRole.LEADER:
        cursor.update(phase="makers", maker_index=0, plan=output)
    elif role == LoopRole.MAKER:
        cursor["maker_outputs"] = [*cursor.get("maker_outputs", []), output]
        cursor["maker_index"] = int(cursor.get("maker_index", 0)) + 1
    else:
        cursor.update(phase="done", verdict=output)
    return cursor


async def drive_run(driver: RunDriver, claim: Claimed) -> None:
    """Drive one claimed run until it finishes, parks or the lease is lost."""
    lease = claim.lease
    if claim.columns is not None and claim.status != RunStatus.PREPARING.value:
        # Started by its claim (it needed no preparation): only its workspace may be missing.
        run = run_state_of(lease.run_id, claim.status, claim.columns)
        status = run.status
        if not _plain_workspace_made(run):
            status = await driver.db(_workspace_for_started, lease, run)
    else:
        retry = float(driver_setting("LOCK_RETRY_SECONDS"))
        run, status = await driver.db(_load_and_prepare, lease, retry)
    if status in (RunStatus.RUNNING.value, RunStatus.VERIFYING.value):
        await reclaim_workspace(driver, lease, run.cursor.get("workdir"))
    # A run claimed before (resumed after an approval, a retry, a crash) may be resuming its
    # invocation: the steps of its first invocation here came with the claim (a run the claim
    # started), or are read while the invocation's start is counted.
    resuming, resume_steps = _claimed_before(claim), claim.resume_steps
    while status in (RunStatus.RUNNING.value, RunStatus.VERIFYING.value):
        step = _next_invocation(run)
        if step is None:
            return
        role, name, employee = step
        if role == LoopRole.VERIFIER and status == RunStatus.RUNNING.value:
            run.cursor["phase"] = "verifier"
            await driver.db(_enter_verification, lease, run.cursor, run.repository)
            status = RunStatus.VERIFYING.value
        known = resume_steps[1] if resume_steps and resume_steps[0] == name else None
        outcome = await _invoke(
            driver, lease, run, role, name, employee, resuming=resuming, steps=known
        )
        resuming, resume_steps = False, None
        if outcome.kind != OutcomeKind.COMPLETED:
            await driver.db(_conclude_invocation, lease, run, outcome, step)
            return
        run.cursor = _advance_cursor(run, role, outcome.output)
        if role == LoopRole.VERIFIER:
            await driver.db(_conclude_verdict, lease, run, outcome.output)
            return
        await driver.db(run_update_fenced, lease, cursor=run.cursor)


def _claimed_before(claim: Claimed) -> bool:
    """Was the run claimed before this claim? Its first claim takes the lease token from 0 to
    1, and the token never goes back (a release raises it too); ``attempts`` would not say,
    as a clean release (a park on an approval) resets it."""
    return claim.lease.token > 1


def with_resume_steps(claim: Claimed) -> Claimed:
    """``claim`` with the steps of the invocation its run comes back to, read at once on the
    claim's database thread, for a run claimed before (resumed after an approval, a retry, a
    crash) that its claim started: a resume replays them, and read here, on a connection just
    used, before the invocation's start and the employee's profile are read in parallel, they
    cost the least time (their read grew a resume's time with the run's history). Only the
    lease holder writes a run's steps, and the claim made this worker the holder, so they are
    what the invocation would read after its start. A failed read is left to the invocation."""
    if not _claimed_before(claim) or claim.columns is None or claim.status == RunStatus.PREPARING:
        return claim
    # The claim has committed: nothing here may keep it from reaching the driver.
    try:
        cursor, bindings = claim.columns["cursor"] or {}, claim.columns["role_bindings"]
        following = _next_invocation_of(cursor, bindings)
        if following is None:
            return claim
        invocation = following[1]
        records = step_services.steps_of_invocation(claim.lease.run_id, invocation)
    except Exception:
        logger.info("run %s: steps not read with the claim", claim.lease.run_id, exc_info=True)
        return claim
    return dataclasses.replace(claim, resume_steps=(invocation, records))


def _plain_workspace_made(run: RunState) -> bool:
    """The workspace of a run its claim started exists, or is a plain folder made here at
    once (a ``mkdir``, no trip to the database threads); False: :func:`_workspace_for_started`
    makes it, or fails the run with the reason."""
    path = Path(run.cursor["workdir"])
    if path.is_dir():
        return True
    if run.repository.get("repositoryRoot"):
        return False  # a worktree (git): made on the database threads
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return True


def _workspace_for_started(lease: Lease, run: RunState) -> str:
    """Create the workspace of a run its claim started (a plain folder, or an existing
    worktree); a run whose workspace cannot be made fails with the reason."""
    try:
        workspace_ensure(run.id, run.repository)
    except WorkspaceError as exc:
        return _fail_for_workspace(lease, run, exc)
    return run.status


def _fail_for_workspace(lease: Lease, run: RunState, exc: WorkspaceError) -> str:
    """A run whose workspace cannot be made fails with the reason."""
    run_transition(
        run_id=run.id,
        to=RunStatus.FAILED,
        actor=lease.owner,
        lease=lease,
        event_type="workspace.failed",
        fields={"terminal_reason": "workspace_error", "failure_reason": str(exc)},
    )
    return RunStatus.FAILED.value


def _load_and_prepare(lease: Lease, retry: float) -> tuple[RunState, str]:
    """:func:`load_run_state` then :func:`prepare`, in one trip to the database threads."""
    run = load_run_state(lease.run_id)
    return run, prepare(lease, run, retry)


def driver_setting(name: str) -> Any:
    from django.conf import settings

    return settings.LOOPWRIGHT[name]


async def _invoke(
    driver: RunDriver,
    lease: Lease,
    run: RunState,
    role: LoopRole,
    name: str,
    employee: str,
    *,
    resuming: bool = False,
    steps: list[StepRecord] | None = None,
) -> InvocationOutcome:
    request = InvocationRequest(
        run_id=run.id,
        role=role,
        invocation=name,
        employee_username=employee,
        goal=run.goal,
        harness=_harness_for(run, role, employee),
        # Only the verifier's context reads the database (its artifacts).
        context=(
            await driver.db(_context_for, run, role)
            if role == LoopRole.VERIFIER
            else _context_for(run, role)
        ),
        inputs=run.inputs,
        workdir=run.cursor.get("workdir"),
    )
    journal = DbJournal(driver, lease, role, name)
    if steps is not None:
        journal.steps_read(steps)  # with the claim
    elif resuming:
        journal.read_steps_early()
    # What the invoker reads before it starts (its own round trips) overlaps the start's.
    prepare = getattr(driver.invoker, "prepare", None)
    preparing = asyncio.ensure_future(prepare(request, journal)) if prepare else None
    try:
        start, calls = await driver.db(_invocation_begin, lease, role, name, run.limits)
        journal.started(
            fresh=start.started,
            metered=start.metered,
            steps=start.steps,
            limits=start.limits,
            calls=calls,
        )
        if preparing is None:
            outcome = await driver.invoker.invoke(request, journal)
        else:
            prepared = await preparing
            outcome = await driver.invoker.invoke(request, journal, prepared=prepared)  # type: ignore[call-arg]
        await journal.flush()  # the final answer's model step
        run.limits = journal.limits or start.limits  # for the next invocation's start
        return outcome
    except RunHalted as halt:
        # A budget or the tool-loop policy stopped the run; nothing of the refused step was
        # persisted, so a resume (after a raise, say) starts that step afresh.
        await journal.flush()
        return InvocationOutcome(
            kind=halt.outcome, code=halt.code, reason=halt.reason, output=halt.data
        )
    except RetryLater as exc:
        await journal.flush()
        await driver.db(_park_for_retry, lease, str(exc), exc.delay_seconds)
        return InvocationOutcome(kind=OutcomeKind.BLOCKED, code="__parked__")
    except (LeaseLost, OperationalError, InterfaceError):
        raise
    except Exception as exc:
        # A bug or an unexpected failure in the invoker: fail the run with its cause rather
        # than letting the lease expire again and again.
        logger.exception("run %s: %s invocation raised", run.id, name)
        with contextlib.suppress(Exception):
            await journal.flush()
        return InvocationOutcome(
            kind=OutcomeKind.FAILED,
            code="error",
            reason=f"{name} invocation failed: {type(exc).__name__}: {str(exc)[:500]}",
        )
    finally:
        journal.forget_early_steps()
        if preparing is not None:
            _abandon(preparing)


def _abandon(task: asyncio.Future[Any]) -> None:
    """Stop a preparation the invocation did not wait for (its start failed or halted)."""
    if not task.done():
        task.cancel()
    elif not task.cancelled():
        task.exception()  # retrieved: an error of an unused preparation is not an error


def _invocation_begin(
    lease: Lease, role: LoopRole, name: str, expected: budgets.RunLimits | None = None
) -> tuple[budgets.InvocationStart, dict[str, int]]:
    """Count the invocation's start, and read the run's tool calls so far (by hash)."""
    return step_services.invocation_begin(
        lease, role=role.value, invocation=name, expected=expected
    )


def _context_for(run: RunState, role: LoopRole) -> dict[str, Any]:
    """What the invocation sees of earlier work, and the JSON shape its answer must have."""
    context: dict[str, Any] = {
        "plan": run.cursor.get("plan"),
        "maker_outputs": run.cursor.get("maker_outputs", []),
        "autonomy_level": run.autonomy_level,
        "auto_allowlist": (run.policy.get("approvals") or {}).get("autoAllowlist", []),
    }
    if role == LoopRole.LEADER:
        context.update(response_format="json_schema", response_schema=PLAN_SCHEMA)
    elif role == LoopRole.VERIFIER:
        context.update(
            response_format="json_schema",
            response_schema=VERDICT_SCHEMA,
            required_checks=run.policy.get("requiredChecks", []),
            artifacts=list(LoopArtifact.objects.filter(run_id=run.id).values("id", "kind", "name")),
        )
    return context


def _enter_verification(lease: Lease, cursor: dict[str, Any], repository: dict[str, Any]) -> None:
    """Store the makers' diff as an artifact (the verifier's evidence), then start verifying."""
    diff = workspace_diff(lease.run_id, repository)
    if diff and not LoopArtifact.objects.filter(run_id=lease.run_id, kind="diff").exists():
        LoopArtifact.objects.create(
            run_id=lease.run_id,
            kind="diff",
            name="changes.diff",
            content_type="text/x-diff",
            content=diff,
            metadata={"baseRef": repository.get("baseRef", "")},
        )
    run_transition(
        run_id=lease.run_id,
        to=RunStatus.VERIFYING,
        actor=lease.owner,
        lease=lease,
        event_type="verification.started",
        fields={"cursor": cursor},
    )


def _park_for_retry(lease: Lease, reason: str, delay_seconds: float) -> None:
    run_transition(
        run_id=lease.run_id,
        to=RunStatus.QUEUED,
        actor=lease.owner,
        lease=lease,
        event_type="run.retry_later",
        data={"reason": reason, "delay_seconds": delay_seconds},
        fields={"not_before": db.time_in(delay_seconds)},
    )


_OUTCOME_TARGET = {
    OutcomeKind.NEEDS_APPROVAL: (RunStatus.WAITING_APPROVAL, "approval.requested"),
    OutcomeKind.FAILED: (RunStatus.FAILED, "run.failed"),
    OutcomeKind.BLOCKED: (RunStatus.BLOCKED, "run.blocked"),
    OutcomeKind.ESCALATE: (RunStatus.WAITING_HUMAN, "run.escalated"),
}
#: The reason a run records when the invoker gave no code (docs/runs.md lists them all).
_DEFAULT_CODE = {
    OutcomeKind.FAILED: "error",
    OutcomeKind.BLOCKED: "blocked",
    OutcomeKind.ESCALATE: "escalated",
}
#: Events of the halts the journal raises, by code prefix (``budget_exhausted:<metric>``).
_HALT_EVENTS = {"budget_exhausted": "budget.exhausted", "tool_loop": "toolloop.escalated"}


def _event_type(outcome: InvocationOutcome, default: str) -> str:
    return _HALT_EVENTS.get(outcome.code.split(":", 1)[0], default)


@transaction.atomic
def _conclude_invocation(
    lease: Lease, run: RunState, outcome: InvocationOutcome, step: tuple[LoopRole, str, str]
) -> None:
    if outcome.code == "__parked__":
        return  # already re-queued by _park_for_retry
    target, event_type = _OUTCOME_TARGET[outcome.kind]
    fields: dict[str, Any] = {"cursor": run.cursor}
    if outcome.kind in _DEFAULT_CODE:
        fields.update(
            terminal_reason=outcome.code or _DEFAULT_CODE[outcome.kind],
            failure_reason=outcome.reason,
        )
    run_transition(
        run_id=lease.run_id,
        to=target,
        actor=lease.owner,
        lease=lease,
        event_type=_event_type(outcome, event_type),
        data={"code": outcome.code, "reason": outcome.reason, **outcome.output},
        fields=fields,
    )
    if outcome.kind == OutcomeKind.NEEDS_APPROVAL:
        role, invocation, employee = step
        approvals_open(
            lease=lease,
            role=role.value,
            invocation=invocation,
            employee=employee,
            gated=list(outcome.output.get("gated") or []),
        )


def _conclude_verdict(lease: Lease, run: RunState, verdict: dict[str, Any]) -> None:
    """pass → succeeded (L1) or waiting_human (L2/L3); reject → failed; else escalate.

    Missing required checks and evidence that is not an artifact of this run make the verdict
    an escalation (``judge_verdict``)."""
    artifact_ids = {
        str(i) for i in LoopArtifact.objects.filter(run_id=run.id).values_list("id", flat=True)
    }
    value, problems = judge_verdict(
        verdict,
        required_checks=list(run.policy.get("requiredChecks", [])),
        run_artifact_ids=artifact_ids,
    )
    fields: dict[str, Any] = {
        "cursor": run.cursor,
        "result": {**verdict, "effective_verdict": value, "problems": problems},
    }
    given = verdict.get("reasons")
    reasons = "; ".join(str(r) for r in given) if isinstance(given, list) else ""
    if value == "pass" and run.autonomy_level == "L1":
        target, fields["terminal_reason"] = RunStatus.SUCCEEDED, "verified"
    elif value == "pass":
        target = RunStatus.WAITING_HUMAN
        fields.update(
            terminal_reason="awaiting_acceptance",
            failure_reason=(
                f"The verifier passed the result; autonomy level {run.autonomy_level} needs a "
                "human to accept it."
            ),
        )
    elif value == "reject":
        target = RunStatus.FAILED
        fields.update(terminal_reason="rejected_by_verifier", failure_reason=reasons or "rejected")
    else:
        target = RunStatus.WAITING_HUMAN
        why = "; ".join([*problems, *([reasons] if reasons else [])])
        fields.update(
            terminal_reason="escalated_by_verifier",
            failure_reason=f"The verification escalated to a human: {why or 'no reason given'}",
        )
    run_transition(
        run_id=lease.run_id,
        to=target,
        actor=lease.owner,
        lease=lease,
        event_type="verification.verdict",
        data={"verdict": verdict.get("verdict"), "effective": value, "problems": problems},
        fields=fields,
    )

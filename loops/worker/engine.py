"""What a worker does with a claimed run: prepare, then leader → makers → verifier.

The run's ``cursor`` records which invocation comes next and what earlier ones produced; it is
written (fenced) after each invocation completes, so a reclaimed run continues where it
stopped, and within an invocation the journal's persisted steps (:mod:`loops.worker.journal`)
carry it further.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction
from django.db.models import F
from django.utils import timezone

from loops.models import LoopArtifact, LoopRun, RunStatus
from loops.roles import PLAN_SCHEMA, VERDICT_SCHEMA
from loops.services import budget_rules, claim_sql
from loops.services import steps as step_services
from loops.services.approvals import approvals_open
from loops.services.artifacts import run_artifacts
from loops.services.checkpoints import resume_point_of
from loops.services.claims import Claimed
from loops.services.endings import run_transition
from loops.services.harness_limits import (
    isolation_refusal,
)
from loops.services.locks import lock_wait_detail, path_locks_acquire
from loops.services.transitions import Lease, run_update_fenced, run_wait
from loops.services.waits import wait_elapsed_seconds
from loops.services.workspaces import WorkspaceError, workspace_diff, workspace_ensure
from loops.spans import invocation_span_id, run_span_id
from loops.worker.harness_bind import (
    HARNESS_EVENT,
    TIMEOUT_CODE,
    harness_limits_of,
    invocation_open,
    isolation_fail,
    within,
)
from loops.worker.journal import DbJournal, DbThreads, abandon
from loops.worker.model_waits import model_wait_journal, park_for_retry
from loops.worker.recovery import reclaim_workspace
from loops.worker.verdicts import conclude_verdict
from orchestrator.logcontext import SPAN_ID, TRACE_ID
from orchestrator.sql import time_in
from runtime.invocation import (
    InvocationOutcome,
    InvocationRequest,
    LeaseLost,
    LoopRole,
    OutcomeKind,
    ResumePoint,
    RetryLater,
    RoleInvoker,
    RunHalted,
)

logger = logging.getLogger(__name__)


class RunHost(DbThreads, Protocol):
    """What :func:`drive_run` needs of the run driver: its database threads and its invoker."""

    invoker: RoleInvoker


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
    #: The wait the run is in (``LoopRun.wait``), as the claim found it.
    wait: dict[str, Any] = field(default_factory=dict)
    #: The run's limits as last read from the database (with their fingerprint), which lets
    #: an invocation start in one statement that proves them unchanged; None: not known.
    limits: budget_rules.RunLimits | None = None
    #: The run's trace (``LoopRun.trace_id``): its log lines and spans belong to it.
    trace_id: str = ""
    #: Who the run is for (``LoopRun.triggered_by``): its invocations' ``user``.
    triggered_by: str = ""
    #: The instruction versions the run pinned (``LoopRun.instruction_versions``).
    instruction_versions: dict[str, int] = field(default_factory=dict)
    #: The key of the run's pattern (model alias rules match on it).
    pattern_key: str = ""


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
        wait=dict(columns["wait"] or {}),
        trace_id=columns["trace_id"],
        triggered_by=columns["triggered_by"],
        instruction_versions=dict(columns["instruction_versions"] or {}),
        limits=budget_rules.limits_from_row(run_id, pattern_id, snapshot, pattern_policy),
        pattern_key=columns[claim_sql.PATTERN_KEY],
    )


def load_run_state(run_id: uuid.UUID) -> RunState:
    run = LoopRun.objects.annotate(pattern_key=F("pattern__key")).get(pk=run_id)
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
        wait=dict(run.wait or {}),
        trace_id=run.trace_id,
        triggered_by=run.triggered_by,
        instruction_versions=dict(run.instruction_versions or {}),
        pattern_key=run.pattern_key,
    )


# --- preparation -----------------------------------------------------------------------------


def prepare(lease: Lease, run: RunState, lock_retry_seconds: float) -> str:
    """Take the path locks and move to running/verifying, or park in waiting_lock.

    Returns the status the run is in afterwards (a run its claim already started is left
    as it is).
    """
    if isolation_fail(lease, run.harness_snapshots, run.repository):
        return RunStatus.FAILED.value
    if run.status in (RunStatus.RUNNING.value, RunStatus.VERIFYING.value):
        return run.status
    repo_key = run.repository.get("repositoryKey") or ""
    paths = list(run.repository.get("actingOn") or [])
    if repo_key and paths:
        conflicts = path_locks_acquire(
            run_id=run.id, repository_key=repo_key, paths=paths, wait=run.wait
        )
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
    """Park the run in its lock wait (one ``lock.waiting`` when the wait starts, then only the
    wait record), or fail it once the wait has lasted ``lockWaitTimeoutSeconds``."""
    limit = int(run.policy.get("lockWaitTimeoutSeconds", 3600))
    current = run.wait if run.wait.get("kind") == "lock" else None
    if wait_elapsed_seconds(current, timezone.now()) > limit:
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
    run_wait(
        lease=lease,
        to=RunStatus.WAITING_LOCK,
        kind="lock",
        event_type="lock.waiting",
        detail=lock_wait_detail(conflicts),
        fields={"not_before": time_in(retry_seconds)},
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


async def drive_run(driver: RunHost, claim: Claimed) -> None:
    """Drive one claimed run until it finishes, parks or the lease is lost."""
    lease = claim.lease
    if claim.columns is not None and claim.status != RunStatus.PREPARING.value:
        # Started by its claim (it needed no preparation): only its workspace may be missing.
        run = run_state_of(lease.run_id, claim.status, claim.columns)
        status = run.status
        if isolation_refusal(run.harness_snapshots or {}, run.repository or {}) is not None:
            await driver.db(isolation_fail, lease, run.harness_snapshots, run.repository)
            return
        if not _plain_workspace_made(run):
            status = await driver.db(_workspace_for_started, lease, run)
    else:
        retry = float(driver_setting("LOCK_RETRY_SECONDS"))
        run, status = await driver.db(_load_and_prepare, lease, retry)
    # This task's log lines name the run's trace and span (its invocation's while one runs).
    run_span = run_span_id(run.trace_id, str(run.id))
    TRACE_ID.set(run.trace_id)
    SPAN_ID.set(run_span)
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
        SPAN_ID.set(invocation_span_id(run.trace_id, str(run.id), name))
        outcome = await _invoke(
            driver, lease, run, role, name, employee, resuming=resuming, steps=known
        )
        SPAN_ID.set(run_span)
        resuming, resume_steps = False, None
        if outcome.kind != OutcomeKind.COMPLETED:
            await driver.db(_conclude_invocation, lease, run, outcome, step)
            return
        run.cursor = _advance_cursor(run, role, outcome.output)
        if role == LoopRole.VERIFIER:
            await driver.db(conclude_verdict, lease, run, outcome.output)
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
    crash) that its claim started: a resume replays them, and this read adds no round trip of
    its own. Only the lease holder writes a run's steps, and the claim made this worker the
    holder, so they are what the invocation would read after its start. A failed read is left
    to the invocation."""
    if not _claimed_before(claim) or claim.columns is None or claim.status == RunStatus.PREPARING:
        return claim
    # The claim has committed: nothing here may keep it from reaching the driver.
    try:
        cursor, bindings = claim.columns["cursor"] or {}, claim.columns["role_bindings"]
        following = _next_invocation_of(cursor, bindings)
        if following is None:
            return claim
        invocation = following[1]
        point = resume_point_of(claim.lease.run_id, invocation)
    except Exception:
        logger.info("run %s: steps not read with the claim", claim.lease.run_id, exc_info=True)
        return claim
    return dataclasses.replace(claim, resume_steps=(invocation, point))


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
    return settings.LOOPWRIGHT[name]


async def _invoke(
    driver: RunHost,
    lease: Lease,
    run: RunState,
    role: LoopRole,
    name: str,
    employee: str,
    *,
    resuming: bool = False,
    steps: ResumePoint | None = None,
) -> InvocationOutcome:
    snapshot = _harness_for(run, role, employee)
    harness = harness_limits_of(snapshot)
    request = InvocationRequest(
        run_id=run.id,
        role=role,
        invocation=name,
        employee_username=employee,
        goal=run.goal,
        harness=snapshot,
        # Only the verifier's context reads the database (its artifacts).
        context=(
            await driver.db(_context_for, run, role)
            if role == LoopRole.VERIFIER
            else _context_for(run, role)
        ),
        inputs=run.inputs,
        workdir=run.cursor.get("workdir"),
        user=run.triggered_by,
        instructions=run.instruction_versions,
    )
    journal = model_wait_journal(driver, lease, role, name, harness=harness, wait=run.wait)
    if steps is not None:
        journal.steps_read(steps)  # with the claim
    elif resuming:
        journal.read_steps_early()
    # What the invoker reads before it starts (its own round trips) overlaps the start's.
    preparing = asyncio.ensure_future(driver.invoker.prepare(request, journal))
    try:
        opened = await driver.db(invocation_open, lease, role, name, run.limits, harness, snapshot)
        start = opened.start
        journal.started(
            fresh=start.started,
            metered=start.metered,
            steps=start.steps,
            limits=start.limits,
            calls=opened.calls,
            usage=opened.usage,
        )
        outcome = await within(
            opened.deadline, _invoked(driver.invoker, request, journal, preparing)
        )
        await journal.flush()  # the final answer's model step
        run.limits = journal.limits or start.limits  # for the next invocation's start
        return outcome
    except RunHalted as halt:
        # A budget, a harness limit or the tool-loop policy stopped the run; nothing of the
        # refused step was persisted, so a resume (after a raise, say) starts it afresh.
        if halt.code == TIMEOUT_CODE:
            journal.drop_pending()  # stopped mid-step: a write may still be in flight
        await journal.flush()
        return InvocationOutcome(
            kind=halt.outcome, code=halt.code, reason=halt.reason, output=halt.data
        )
    except RetryLater as exc:
        await journal.flush()
        await driver.db(park_for_retry, lease, exc, snapshot)
        return InvocationOutcome(kind=OutcomeKind.BLOCKED, code="__parked__")
    except (LeaseLost, OperationalError, InterfaceError):
        raise
    except Exception as exc:
        # A bug in the invoker: fail the run with its cause, not a lease expiring again and again.
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
        abandon(preparing)


async def _invoked(
    invoker: RoleInvoker,
    request: InvocationRequest,
    journal: DbJournal,
    preparing: asyncio.Future[Any],
) -> InvocationOutcome:
    return await invoker.invoke(request, journal, prepared=await preparing)


def _invocation_begin(
    lease: Lease, role: LoopRole, name: str, expected: budget_rules.RunLimits | None = None
) -> tuple[budget_rules.InvocationStart, dict[str, int]]:
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
        "semantic_cache": run.policy.get("semanticCache"),
        "content_safety": run.policy.get("contentSafety"),
        "pattern": run.pattern_key,
    }
    if role == LoopRole.LEADER:
        context.update(response_format="json_schema", response_schema=PLAN_SCHEMA)
    elif role == LoopRole.VERIFIER:
        context.update(
            response_format="json_schema",
            response_schema=VERDICT_SCHEMA,
            required_checks=run.policy.get("requiredChecks", []),
            artifacts=run_artifacts(run.id),
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
_HALT_EVENTS = {
    "budget_exhausted": "budget.exhausted",
    "tool_loop": "toolloop.escalated",
    "harness_limit": HARNESS_EVENT,
}


def _event_type(outcome: InvocationOutcome, default: str) -> str:
    return _HALT_EVENTS.get(outcome.code.split(":", 1)[0], default)


@transaction.atomic
def _conclude_invocation(
    lease: Lease, run: RunState, outcome: InvocationOutcome, step: tuple[LoopRole, str, str]
) -> None:
    if outcome.code == "__parked__":
        return  # already re-queued by park_for_retry
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

"""The engine's step journal: every write of an invocation's steps, fenced by the lease.

:class:`DbJournal` is the :class:`runtime.invocation.StepJournal` the engine hands the invoker.
It runs each write on the driver's database threads and keeps what makes a step cheap: a model
step rides with the next write, a read whose limits allow it runs before it is persisted, and
the steps of a resumed invocation are read while its start is counted (docs/worker.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol, TypeVar

from django.utils import timezone

from loops.models import StepStatus
from loops.services import budget_rules, budgets, step_exact, step_fast, step_records, tool_repeats
from loops.services import steps as step_services
from loops.services.approvals import approval_authorize_reviewed
from loops.services.checkpoints import checkpoint_keep, resume_point_of
from loops.services.harness_limits import HarnessLimits
from loops.services.transitions import Lease
from orchestrator.metrics import STEP_SECONDS
from runtime.invocation import LoopRole, RecordedCall, ResumePoint, StepRecord, ToolCallRefused

T = TypeVar("T")


class DbThreads(Protocol):
    """Where database work runs off the event loop: the run driver's threads, each with its
    own pooled connection."""

    async def db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...


class DbJournal:
    """The engine's :class:`StepJournal`: every write fenced by the lease.

    A model step is numbered here and written with the journal's next write, in the same
    transaction: with the first call it made (``tool_step_begin(model_step=…)``), or on its
    own before anything else is written (:meth:`flush`; the engine flushes when the invocation
    returns). Its calls therefore never start before it is persisted, and a step costs one
    transaction fewer. Only the lease holder writes a run's steps, so the journal knows the
    next seq; the write also checks it (``JournalOutOfStep``)."""

    #: ``db_call`` runs on the driver's pooled database threads (tools may use it for reads).
    pooled_db = True

    def __init__(
        self,
        driver: DbThreads,
        lease: Lease,
        role: LoopRole,
        invocation: str,
        harness: HarnessLimits | None = None,
    ) -> None:
        self.driver, self.lease, self.role, self.invocation = driver, lease, role, invocation
        #: The per-run totals of the role's harness, and the run's usage of them as this
        #: journal knows it (read at the start, added to as it writes; None: not known, so
        #: every write is judged by them): see ``harness_limits``.
        self.harness = harness or HarnessLimits()
        self._usage: dict[str, Decimal] | None = None
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
        self._pending: step_records.ModelStep | None = None
        self._writing: asyncio.Future[None] | None = None
        #: The run's rule for reads as of the latest write, and its calls so far by hash
        #: (None: not known; every read is then begun before it runs): those made more than
        #: once before the start exactly, then counted on as this journal writes; any call not
        #: in it was made at most ``_unlisted`` times before the start (0 in a run without
        #: steps), which is where its count starts.
        self._rule: step_records.ReadRule | None = None
        self._calls: dict[str, int] | None = None
        self._unlisted = 1
        #: Where the invocation resumes (its checkpoint and the steps after it), read early
        #: (:meth:`read_steps_early`) or with the claim (:meth:`steps_read`).
        self._early_steps: asyncio.Future[ResumePoint] | None = None

    async def sub_journal(self, invocation: str) -> DbJournal:
        """The journal of a sub-agent of this invocation (``<name>/sub:<n>``, docs/sub-agents.md):
        the same run, lease, role and harness limits, its steps persisted under its own name
        (so a resumed parent, re-issuing the dispatch, resumes the child from them) and judged
        and charged like the parent's.

        The parent's pending model step is written first. From then on the child writes steps
        between the parent's, so neither numbers model steps itself: the database does
        (``_steps`` unknown), and reads are begun before they run."""
        await self.flush()
        self._steps = None
        child = DbJournal(self.driver, self.lease, self.role, invocation, self.harness)
        child._usage = self._usage  # one tally of the run's harness-bound usage
        child._unmetered_until = self._unmetered_until
        return child

    def read_steps_early(self) -> None:
        """Begin reading where the invocation resumes now, while its start is counted, so a
        resumed invocation's replay adds no round trip of its own. Only the lease holder writes
        a run's steps, and it holds the lease from the claim on, so this reads what
        :meth:`resume_point` would; a lost lease fails the start (LeaseLost) before anything
        read is used."""
        self._early_steps = asyncio.ensure_future(self._read_resume_point())

    def steps_read(self, point: ResumePoint) -> None:
        """Where the invocation resumes, already read (with the claim: ``with_resume_steps``)."""
        self._early_steps = asyncio.get_running_loop().create_future()
        self._early_steps.set_result(point)

    def forget_early_steps(self) -> None:
        """The invocation ended without asking for its steps: drop the early read."""
        early, self._early_steps = self._early_steps, None
        if early is not None:
            abandon(early)

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
        limits: budget_rules.RunLimits | None = None,
        calls: dict[str, int] | None = None,
        usage: dict[str, Decimal] | None = None,
    ) -> None:
        """What the invocation's start found: a ``fresh`` invocation has no steps yet (none is
        written before its start is counted); an unmetered run needs no admission for now;
        ``steps`` is the run's step count, from which the journal numbers model steps;
        ``limits`` and ``calls`` (the run's tool calls made more than once, by hash:
        ``steps.call_counts``) say which reads may run before they are persisted
        (:meth:`runs_first`); ``usage`` the run's usage of the metrics its harness bounds."""
        self._usage = usage
        self._fresh = fresh
        self._steps = steps
        self._rule = None if limits is None else step_records.read_rule(limits)
        self._calls = calls
        self._unlisted = 0 if steps == 0 else 1
        if not metered:
            self._unmetered_until = time.monotonic() + budget_rules.ADMISSION_RECHECK_SECONDS

    @property
    def limits(self) -> budget_rules.RunLimits | None:
        """The run's limits as of the journal's latest write (None: not known)."""
        return None if self._rule is None else self._rule.limits

    def runs_first(self, name: str, request: dict[str, Any]) -> bool:
        """May this read-effect call run before anything of it is persisted? Only when, as of
        the journal's latest write, no limit must judge it first (see :class:`ReadRule`); the
        write that follows (:meth:`record_call`) judges it again, exactly."""
        if self._rule is None or self._calls is None or self._steps is None:
            return False
        if self._judged(_TOOL_CALL) is not None:
            return False
        # Exactly, or at most (an upper bound keeps this on the safe side; the write counts).
        made = self._calls.get(_digest(name, request), self._unlisted)
        return self._rule.runs_first(name, made + 1)

    def _judged(self, amounts: dict[str, int]) -> HarnessLimits | None:
        """The harness limits when a write taking ``amounts`` must be judged by them: the
        journal's tally says it could reach one (or the tally is not known)."""
        if not self.harness.bounds:
            return None
        if self._usage is None or self.harness.near(self._usage, amounts):
            return self.harness
        return None

    def _tally(self, metric: str, n: Any) -> None:
        if self._usage is not None and metric in self._usage and n:
            self._usage[metric] += Decimal(str(n))

    def _counted(self, name: str, request: dict[str, Any]) -> None:
        """A tool step of this call was persisted (the tool-loop policy counts it)."""
        if self._calls is not None:
            digest = _digest(name, request)
            self._calls[digest] = self._calls.get(digest, self._unlisted) + 1

    def _saw(self, seq: int) -> None:
        if self._steps is not None:
            self._steps = max(self._steps, seq)

    def drop_pending(self) -> None:
        """Forget the recorded model step not written yet: the invocation was stopped in the
        middle (its deadline), a write of it may still be in flight on a database thread, and
        no later write may carry it under a seq that write could have taken."""
        self._pending = None

    async def flush(self) -> None:
        """Write the pending model step (if any) and wait for a write carrying it to end."""
        pending, self._pending = self._pending, None
        if pending is not None:
            write = self.driver.db(step_fast.model_step_write, self.lease, pending)
            _, rule = await self._carrying(write)
            self._learned(rule)
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
        early = await self._early()
        if early is not None and early[0] is None:  # no checkpoint: the read holds every step
            return early[1]
        return await self._read_steps()

    async def resume_point(self) -> ResumePoint:
        early = await self._early()
        return early if early is not None else await self._read_resume_point()

    async def _early(self) -> ResumePoint | None:
        """What was read early, once (None: nothing); no steps on a fresh start."""
        await self.flush()
        early, self._early_steps = self._early_steps, None
        if self._fresh:
            self._fresh = False
            if early is not None:
                abandon(early)
            return None, []
        return await early if early is not None else None

    async def save_checkpoint(self, upto_seq: int, state: str) -> None:
        await self.flush()
        await self.driver.db(checkpoint_keep, self.lease, self.invocation, upto_seq, state)

    async def _read_steps(self) -> list[StepRecord]:
        return await self.driver.db(
            step_services.steps_of_invocation, self.lease.run_id, self.invocation
        )

    async def _read_resume_point(self) -> ResumePoint:
        return await self.driver.db(resume_point_of, self.lease.run_id, self.invocation)

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

    async def ask(self, seq: int, *, question: str) -> None:
        await self.flush()
        self._began.pop(seq, None)
        await self.driver.db(step_services.step_ask, self.lease, seq, question=question)

    async def _tool_start(
        self, name: str, request: dict[str, Any], idempotency_key: str, status: StepStatus
    ) -> int:
        """A tool call under the run's limits: refused (ToolCallRefused), stopped (RunHalted),
        or begun, possibly with a notice for its result. The first call of a model step
        carries that step's write."""
        start = await self._tool_write(
            step_services.tool_step_begin, name, request, idempotency_key, status=status
        )
        if start.notice:
            self.notices[start.seq] = start.notice
        if start.started_at is not None:
            self._began[start.seq] = start.started_at
        return start.seq

    async def _tool_write(
        self,
        store: Callable[..., step_records.ToolStart],
        name: str,
        request: dict[str, Any],
        idempotency_key: str,
        **fields: Any,
    ) -> step_records.ToolStart:
        """Write a tool step with ``store`` (carrying the pending model step, judged by the run's
        rule and, near a limit, its harness); raises ToolCallRefused for a refused call."""
        pending, self._pending = self._pending, None
        if pending is None:
            await self.flush()
        write = self.driver.db(
            store,
            self.lease,
            role=self.role.value,
            invocation=self.invocation,
            name=name,
            request=request,
            idempotency_key=idempotency_key,
            model_step=pending,
            expected=self._rule,
            harness=self._judged(_TOOL_CALL),
            **fields,
        )
        start = await self._reserving(self._carrying(write) if pending is not None else write)
        self._wrote(start, name, request)
        if start.refused:
            raise ToolCallRefused(start.refused, seq=start.seq)
        return start

    async def _reserving(self, write: Awaitable[step_records.ToolStart]) -> step_records.ToolStart:
        """A tool call's write, its unit in the tally while it is in flight (calls may begin
        side by side); taken back when the write failed or the call was refused."""
        self._tally("toolCalls", 1)
        try:
            start = await write
        except BaseException:
            self._tally("toolCalls", -1)
            raise
        if start.refused:
            self._tally("toolCalls", -1)
        return start

    def _wrote(self, start: step_records.ToolStart, name: str, request: dict[str, Any]) -> None:
        """A tool step was persisted: its seq, its count, and the run's rule for reads."""
        self._saw(start.seq)
        self._counted(name, request)
        self._learned(start.rule)

    def _learned(self, rule: step_records.ReadRule | None) -> None:
        """The run's rule as of a write that read its limits or proved them unchanged (None:
        not known). Unmetered, it answers what an admission would ask as freshly as one: the
        next admission is due ADMISSION_RECHECK_SECONDS from this write; metered (a limit
        added meanwhile) or not known (an exact write), the next model call asks."""
        self._rule = rule
        if rule is not None and rule.limits is not None and not budget_rules.metered(rule.limits):
            self._unmetered_until = time.monotonic() + budget_rules.ADMISSION_RECHECK_SECONDS
        else:
            self._unmetered_until = 0.0

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
        start = await self._tool_write(
            step_services.tool_step_record,
            name,
            request,
            idempotency_key,
            response=response,
            error=error,
            started_at=started_at or timezone.now(),
        )
        if start.started_at is None:
            return RecordedCall(start.seq)
        # Begun by the exact path: the caller completes it, with the run's notice if any.
        if start.notice:
            self.notices[start.seq] = start.notice
        self._began[start.seq] = start.started_at
        return RecordedCall(start.seq, completed=False)

    async def admit_model_call(self) -> None:
        await self.flush()
        # The role's harness limits on tokens and cost are judged here only when the tally
        # says one is used up (the database then decides).
        harness = self._judged(_MODEL_CALL)
        # A run no tokens/cost limit binds needs no admission: skip the round trip while its
        # limits were read or proved unchanged (an admission, a write) within the last
        # ADMISSION_RECHECK_SECONDS (a daily limit may appear).
        if harness is None and self._unmetered_until > time.monotonic():
            return
        while True:
            admission = await self.driver.db(budgets.budget_admission, self.lease, harness)
            if admission.wait is None:
                break
            await asyncio.sleep(admission.wait)
        if not admission.metered:
            self._unmetered_until = time.monotonic() + budget_rules.ADMISSION_RECHECK_SECONDS

    def tool_notice(self, seq: int) -> str:
        return self.notices.get(seq, "")

    async def authorize(self, seq: int, name: str, arguments: dict[str, Any]) -> str:
        await self.flush()
        refusal, review = await self.driver.db(
            approval_authorize_reviewed, self.lease, seq=seq, name=name, arguments=arguments
        )
        if review:  # the reviewer's review goes to the model with the call's result
            self.notices[seq] = "\n\n".join(n for n in (self.notices.get(seq), review) if n)
        return str(refusal)

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
        self._tally("tokens", tokens_in + tokens_out)
        self._tally("cost", cost)
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
        if duration_ms is not None:
            _step_observed(kind, response, duration_ms)
        await self.flush()
        self._tally("tokens", tokens_in + tokens_out)
        self._tally("cost", cost)
        if kind == "model" and self._steps is not None:
            # Numbered now, written with the next write (see the class docstring).
            seq = self._steps + 1
            self._pending = step_records.finished_step(self.lease, seq=seq, **fields)
            self._steps = seq
            return seq
        seq = await self.driver.db(step_services.step_record, self.lease, **fields)
        self._saw(seq)
        if kind == "tool":
            self._counted(name, request)
        return seq

    async def event(self, type: str, data: dict[str, Any]) -> None:
        await self.flush()
        await self.driver.db(step_exact.step_event, self.lease, type=type, data=data)

    def idempotency_key(self, step_seq: int, call_index: int = 0) -> str:
        return f"{self.lease.run_id}:{step_seq}:{call_index}"


#: What a tool call takes of the harness-bound metrics and needs room in (as the budgets judge
#: it: a unit of toolCalls, tokens and cost not used up), and what a model call needs room in.
_MODEL_CALL = {"tokens": 0, "cost": 0}
_TOOL_CALL = {"toolCalls": 1, **_MODEL_CALL}


def _step_observed(kind: str, response: Any, duration_ms: int) -> None:
    """``loopwright_step_duration_seconds``, by the endpoint that answered a model step."""
    endpoint = response.get("endpoint") if isinstance(response, dict) else None
    STEP_SECONDS.labels(kind=kind, endpoint=str(endpoint or "")).observe(duration_ms / 1000)


def _digest(name: str, request: dict[str, Any]) -> str:
    """The tool-loop policy's hash of a call, as the step services compute it."""
    return tool_repeats.call_hash(name, tool_repeats.arguments_of(request))


def abandon(task: asyncio.Future[Any]) -> None:
    """Stop a preparation the invocation did not wait for (its start failed or halted)."""
    if not task.done():
        task.cancel()
    elif not task.cancelled():
        task.exception()  # retrieved: an error of an unused preparation is not an error

"""An in-memory :class:`~runtime.invocation.StepJournal` for unit tests of invokers.

It behaves like the engine's journal where invokers can tell (seqs, statuses, gate → approved
or completed, idempotency keys) and adds what tests need: human decisions on gated steps,
crash injection after a chosen write, and a lost lease.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.invocation import LeaseLost, RecordedCall, StepRecord


class SimulatedCrash(BaseException):
    """The worker process died: nothing in the invoker may catch this (hence BaseException)."""


@dataclass
class _Step:
    seq: int
    kind: str
    status: str
    name: str
    idempotency_key: str
    request: dict[str, Any]
    response: Any = None
    error: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0


@dataclass
class MemoryJournal:
    run_id: uuid.UUID = field(default_factory=uuid.uuid4)
    rows: list[_Step] = field(default_factory=list)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    #: ``(operation, kind)`` → raise SimulatedCrash right after that many such writes more.
    crash_after: dict[tuple[str, str], int] = field(default_factory=dict)
    #: ``(operation, kind)`` → raise SimulatedCrash instead of the next such write.
    crash_before: set[tuple[str, str]] = field(default_factory=set)
    lease_lost: bool = False
    writes: list[tuple[str, str, int]] = field(default_factory=list)
    #: Model calls the loop asked admission for (the engine's journal applies budgets there).
    admissions: int = 0
    #: seq → (tool, arguments) a human approved (``approve``); ``authorize`` holds calls to it.
    approved: dict[int, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    #: ``(seq, refusal)`` of every ``authorize``; "" when the call was allowed to run.
    authorizations: list[tuple[int, str]] = field(default_factory=list)

    #: The latest conversation checkpoint kept (``save_checkpoint``): (upto_seq, state).
    checkpoint: tuple[int, str] | None = None

    # --- the StepJournal protocol -------------------------------------------------------------

    async def resume_point(self) -> tuple[str | None, list[StepRecord]]:
        steps = await self.steps()
        if self.checkpoint is None:
            return None, steps
        upto, state = self.checkpoint
        return state, [step for step in steps if step.seq > upto]

    async def save_checkpoint(self, upto_seq: int, state: str) -> None:
        self.checkpoint = (upto_seq, state)

    async def steps(self) -> list[StepRecord]:
        return [
            StepRecord(
                seq=s.seq,
                kind=s.kind,
                status=s.status,
                name=s.name,
                idempotency_key=s.idempotency_key,
                request=copy.deepcopy(s.request),
                response=copy.deepcopy(s.response),
                error=s.error,
            )
            for s in self.rows
        ]

    async def begin(
        self, *, kind: str, name: str, request: dict[str, Any], idempotency_key: str = ""
    ) -> int:
        return self._add("begin", kind, "started", name, request, idempotency_key)

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
        step = self.step(seq)
        self._fence("complete", step.kind)
        step.status = "failed" if error else "completed"
        step.response, step.error = copy.deepcopy(response), error
        step.tokens_in, step.tokens_out, step.cost = tokens_in, tokens_out, cost
        self._wrote("complete", step.kind, seq)

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
        self._fence("record", kind)
        seq = len(self.rows) + 1
        status = "failed" if error else "completed"
        self.rows.append(
            _Step(
                seq,
                kind,
                status,
                name,
                "",
                copy.deepcopy(request),
                copy.deepcopy(response),
                error,
                tokens_in,
                tokens_out,
                cost,
            )
        )
        self._wrote("record", kind, seq)
        return seq

    #: What ``runs_first`` answers (the engine's journal asks the run's limits): by default
    #: every call is begun before it runs; tests of the read-first path turn it on.
    reads_run_first: bool = False

    def runs_first(self, name: str, request: dict[str, Any]) -> bool:
        return self.reads_run_first

    async def record_call(
        self,
        *,
        name: str,
        request: dict[str, Any],
        idempotency_key: str,
        response: Any,
        error: str = "",
        started_at: Any = None,
    ) -> RecordedCall:
        """Like the engine's journal: one write of a finished step (``record_call``, "tool")."""
        self._fence("record_call", "tool")
        seq = len(self.rows) + 1
        status = "failed" if error else "completed"
        self.rows.append(
            _Step(
                seq,
                "tool",
                status,
                name,
                idempotency_key,
                copy.deepcopy(request),
                copy.deepcopy(response),
                error,
            )
        )
        self._wrote("record_call", "tool", seq)
        return RecordedCall(seq)

    async def gate(
        self, *, name: str, request: dict[str, Any], idempotency_key: str, reason: str
    ) -> int:
        # Like the engine's journal, the reason is kept in the request.
        return self._add(
            "gate", "tool", "gated", name, {**request, "gate_reason": reason}, idempotency_key
        )

    async def ask(self, seq: int, *, question: str) -> None:
        self._fence()
        step = self.step(seq)
        assert step.status in ("started", "approved"), step.status
        request = {k: v for k, v in step.request.items() if k != "answer"}
        step.status, step.request = "gated", {**request, "input_request": question}

    async def event(self, type: str, data: dict[str, Any]) -> None:
        self._fence()
        self.events.append((type, copy.deepcopy(data)))

    def idempotency_key(self, step_seq: int, call_index: int = 0) -> str:
        return f"{self.run_id}:{step_seq}:{call_index}"

    async def admit_model_call(self) -> None:
        self.admissions += 1

    def tool_notice(self, seq: int) -> str:
        return ""

    async def db_call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def authorize(self, seq: int, name: str, arguments: dict[str, Any]) -> str:
        self._fence()
        approved = self.approved.get(seq)
        refusal = ""
        if approved is None:
            refusal = f"step {seq} has no approval; the call was not run."
        elif approved != (name, arguments):
            refusal = f"the call differs from the one approved at step {seq}; it was not run."
        self.authorizations.append((seq, refusal))
        return refusal

    # --- test controls ------------------------------------------------------------------------

    def step(self, seq: int) -> _Step:
        return next(s for s in self.rows if s.seq == seq)

    def of_kind(self, kind: str) -> list[_Step]:
        return [s for s in self.rows if s.kind == kind]

    def event_types(self) -> list[str]:
        return [type_ for type_, _ in self.events]

    def approve(self, seq: int, arguments: dict[str, Any] | None = None) -> None:
        step = self.step(seq)
        assert step.status == "gated", step.status
        step.status = "approved"
        if arguments is not None:
            step.request = {**step.request, "arguments": arguments}
        self.approved[seq] = (step.name, copy.deepcopy(step.request.get("arguments") or {}))

    def answer(self, seq: int, text: str) -> None:
        """A person answers the question step ``seq`` asked (like ``loops`` approvals do)."""
        step = self.step(seq)
        assert step.status == "gated" and step.request.get("input_request"), step.status
        step.status, step.request = "approved", {**step.request, "answer": text}
        self.approved[seq] = (step.name, copy.deepcopy(step.request.get("arguments") or {}))

    def reject(self, seq: int, text: str) -> None:
        step = self.step(seq)
        assert step.status == "gated", step.status
        step.status, step.response = "completed", {"content": text}

    def crash_after_next(self, operation: str, kind: str, count: int = 1) -> None:
        """Die right after the ``count``-th next ``operation`` ("begin", "complete",
        "record", "gate") of a step of ``kind`` has been persisted."""
        self.crash_after[(operation, kind)] = count

    def crash_instead_of_next(self, operation: str, kind: str) -> None:
        """Die just before the next ``operation`` of a ``kind`` step is persisted."""
        self.crash_before.add((operation, kind))

    def _add(
        self, op: str, kind: str, status: str, name: str, request: dict[str, Any], key: str
    ) -> int:
        self._fence(op, kind)
        seq = len(self.rows) + 1
        self.rows.append(_Step(seq, kind, status, name, key, copy.deepcopy(request)))
        self._wrote(op, kind, seq)
        return seq

    def _fence(self, op: str = "", kind: str = "") -> None:
        if self.lease_lost:
            raise LeaseLost("lease taken over by another worker")
        if (op, kind) in self.crash_before:
            self.crash_before.discard((op, kind))
            raise SimulatedCrash(f"crash before {op} of a {kind} step")

    def _wrote(self, op: str, kind: str, seq: int) -> None:
        self.writes.append((op, kind, seq))
        left = self.crash_after.get((op, kind))
        if left is None:
            return
        if left <= 1:
            del self.crash_after[(op, kind)]
            raise SimulatedCrash(f"crash after {op} of {kind} step {seq}")
        self.crash_after[(op, kind)] = left - 1

"""An in-memory :class:`~runtime.invocation.StepJournal`: the steps of an invocation that no
run persists (a sub-agent of a request-scoped chat). It keeps what the loop reads back within
the invocation and applies no limit; nothing survives the process."""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from runtime.invocation import RecordedCall, StepRecord, ToolCallRefused, ask_refusal

T = TypeVar("T")


@dataclass
class EphemeralJournal:
    """Steps in a list; seqs from 1; ``tokens`` / ``cost`` sum the model steps."""

    prefix: str = field(default_factory=lambda: uuid.uuid4().hex)
    records: list[StepRecord] = field(default_factory=list)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0

    async def steps(self) -> list[StepRecord]:
        return list(self.records)

    async def resume_point(self) -> tuple[str | None, list[StepRecord]]:
        return None, await self.steps()

    async def save_checkpoint(self, upto_seq: int, state: str) -> None:
        """Nothing resumes from this journal: no checkpoint is kept."""

    def _add(
        self,
        kind: str,
        status: str,
        name: str,
        key: str,
        request: Any,
        response: Any,
        error: str = "",
    ) -> int:
        seq = len(self.records) + 1
        self.records.append(
            StepRecord(
                seq, kind, status, name, key, copy.deepcopy(request), copy.deepcopy(response), error
            )
        )
        return seq

    async def begin(
        self, *, kind: str, name: str, request: dict[str, Any], idempotency_key: str = ""
    ) -> int:
        return self._add(kind, "started", name, idempotency_key, request, None)

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
        old = self.records[seq - 1]
        self.records[seq - 1] = StepRecord(
            seq,
            old.kind,
            "failed" if error else "completed",
            old.name,
            old.idempotency_key,
            old.request,
            copy.deepcopy(response),
            error,
        )
        self._charge(tokens_in, tokens_out, cost)

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
        self._charge(tokens_in, tokens_out, cost)
        return self._add(
            kind, "failed" if error else "completed", name, "", request, response, error
        )

    def _charge(self, tokens_in: int, tokens_out: int, cost: float) -> None:
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out
        self.cost += cost

    def runs_first(self, name: str, request: dict[str, Any]) -> bool:
        return True

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
        status = "failed" if error else "completed"
        return RecordedCall(
            self._add("tool", status, name, idempotency_key, request, response, error)
        )

    async def gate(
        self, *, name: str, request: dict[str, Any], idempotency_key: str, reason: str
    ) -> int:
        return self._add(
            "tool", "gated", name, idempotency_key, {**request, "gate_reason": reason}, None
        )

    async def ask(self, seq: int, *, question: str) -> None:
        raise ToolCallRefused(ask_refusal(question), seq=seq)

    async def event(self, type: str, data: dict[str, Any]) -> None:
        self.events.append((type, copy.deepcopy(data)))

    def idempotency_key(self, step_seq: int, call_index: int = 0) -> str:
        return f"{self.prefix}:{step_seq}:{call_index}"

    async def admit_model_call(self) -> None:
        return None

    async def authorize(self, seq: int, name: str, arguments: dict[str, Any]) -> str:
        return "nothing is approved in an ephemeral invocation"

    def tool_notice(self, seq: int) -> str:
        return ""

    async def db_call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(fn, *args, **kwargs)

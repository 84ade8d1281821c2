"""What a step write carries, and when a write is plain (nothing for a limit to judge).

Shared by the two paths of each step write (``step_fast`` and ``step_exact``) and by the lease
holder's journal, which numbers and keeps a finished model step until its next write.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.utils import timezone

from loops.models import StepKind, StepStatus
from loops.services import step_sql, tool_repeats
from loops.services.budget_rules import (
    RunLimits,
    amount,
    invocation_amounts,
    metered,
)
from loops.services.transitions import Lease


def cost_of(value: float) -> Decimal:
    return Decimal(str(round(value, 6)))


def hash_of(kind: str, name: str, request: Any) -> str | None:
    if kind != StepKind.TOOL:
        return None
    return tool_repeats.call_hash(
        name, tool_repeats.arguments_of(request if isinstance(request, dict) else {})
    )


@dataclass(frozen=True)
class ToolStart:
    """What ``steps.tool_step_begin`` made of a call: its step, and either the result the model
    gets instead of running it (``refused``) or a notice for its result."""

    seq: int
    refused: str = ""
    notice: str = ""
    #: When the step began (its ``started_at``), for ``steps.step_complete``'s one-statement path.
    started_at: datetime | None = None
    #: The run's rule for reads as of this write (None from the exact path).
    rule: ReadRule | None = None


def plain(limits: RunLimits, amounts: dict[str, int], verdict: tool_repeats.RepeatVerdict) -> bool:
    """Nothing to judge: no counted limit on these amounts, no metered limit (whose room a
    tool call must check), an ordinary call for the tool-loop policy."""
    bounded = {*limits.per_run, *limits.daily}
    return (
        verdict is tool_repeats.RepeatVerdict.OK
        and not bounded.intersection(amounts)
        and not metered(limits)
    )


@dataclass(frozen=True)
class ReadRule:
    """What the lease holder's journal needs to let a read-effect call run before anything
    of it is persisted (``steps.tool_step_record`` after it), as of its latest write: the call's
    occurrence the tool-loop policy warns from, and whether a limit must judge every tool call
    before it runs (a tool-call budget, a metered one)."""

    warn_at: int
    judged: bool
    #: The limits the rule was made from (for ``steps.tool_step_record``'s one-round-trip write).
    limits: RunLimits | None = field(default=None, compare=False)

    def runs_first(self, name: str, occurrence: int) -> bool:
        return not self.judged and occurrence < self.warn_at


#: The counted metrics a tool call takes (``budget_rules.TOOL_CALL_AMOUNTS``).
_TOOL_METRICS = frozenset({"toolCalls"})


def read_rule(limits: RunLimits) -> ReadRule:
    counted = _TOOL_METRICS.intersection({*limits.per_run, *limits.daily})
    return ReadRule(
        warn_at=limits.tool_loop.warnAt,
        judged=bool(counted) or metered(limits),
        limits=limits,
    )


def starts_plainly(limits: RunLimits, role: str) -> bool:
    """No metered limit and no counted limit on what a start of ``role`` counts."""
    bounded = {*limits.per_run, *limits.daily}
    return not metered(limits) and not bounded.intersection(invocation_amounts(role))


@dataclass(frozen=True)
class ModelStep:
    """A finished step ready to be written: its row, and the tokens and cost it charges.

    ``seq`` is set when the lease holder's journal numbered it itself (it writes the step
    later, with its next write): the write then also requires the run to have exactly the
    steps before it."""

    row: dict[str, Any]
    charged: dict[str, Decimal]
    seq: int | None = None

    @property
    def steps_before(self) -> int | None:
        return None if self.seq is None else self.seq - 1


def finished_step(
    lease: Lease,
    *,
    role: str,
    invocation: str,
    kind: str,
    name: str,
    request: dict[str, Any],
    response: Any,
    error: str = "",
    tokens_in: int = 0,
    tokens_out: int = 0,
    cost: float = 0.0,
    duration_ms: int | None = None,
    seq: int | None = None,
) -> ModelStep:
    """A finished step (a model call, usually) as ``step_fast.model_step_write`` and
    ``steps.tool_step_begin`` write it."""
    now = timezone.now()
    row = step_sql.step_row(
        role=role,
        invocation=invocation,
        kind=kind,
        status=(StepStatus.FAILED if error else StepStatus.COMPLETED).value,
        name=name,
        request=request,
        response=response,
        error=error,
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        cost=cost_of(cost),
        lease_token=lease.token,
        started_at=now,
        finished_at=now,
        duration_ms=duration_ms,
        call_hash=hash_of(kind, name, request),
    )
    charged = {
        metric: n
        for metric, value in (("cost", cost), ("tokens", tokens_in + tokens_out))
        if (n := amount(value))
    }
    return ModelStep(row=row, charged=charged, seq=seq)


def model_step_charged(step: ModelStep | None) -> tuple[str, ...]:
    """The metered metrics a model step charges (their day's largest call is kept)."""
    return () if step is None else tuple(sorted(step.charged))


class JournalOutOfStep(RuntimeError):
    """The run has other steps than the lease holder's journal numbered its own from: a bug
    (only the lease holder writes steps), refused rather than written under a wrong seq."""


def day() -> str:
    return timezone.now().astimezone(UTC).date().isoformat()

"""Run-level tool-loop detection: identical tool calls counted across the whole run.

The agent runtime already guards one invocation (a duplicate call is skipped from its 3rd
occurrence, a long streak of one tool forces finalisation). The pattern's ``toolLoop`` policy
applies on top at run level, over every invocation and every resume: a call's *occurrence* is
the number of tool steps of the run with the same ``call_hash`` (tool name and canonical
arguments), this one included, whatever became of the earlier ones (run, gated, skipped as a
duplicate, refused). The steps are the count, so it survives crashes, parks and resumes, and it
is taken in the transaction that journals the call (the run's row lock orders parallel calls).

From ``warnAt`` a call still runs but carries a notice (an event, and text after its result);
from ``blockAt`` it is refused (persisted as failed, never executed, the model gets an error);
from ``escalateAt`` the run stops in ``waiting_human`` (reason ``tool_loop``). Calls the runtime
answers without running them count too, and can escalate.
"""

from __future__ import annotations

import enum
import hashlib
import json
import uuid
from typing import Any

from loops.models import LoopStep
from loops.policy import ToolLoopPolicy
from runtime.invocation import ToolLoopEscalated


class RepeatVerdict(enum.StrEnum):
    OK = "ok"
    WARN = "warn"
    BLOCK = "block"
    ESCALATE = "escalate"


def arguments_of(request: dict[str, Any]) -> Any:
    """The call's arguments in a journaled tool request (the runtime's ``arguments`` key; an
    invoker that journals its own shape is hashed whole)."""
    return request.get("arguments", request)


def call_hash(name: str, arguments: Any) -> str:
    """SHA-256 of the tool name and the canonical JSON of its arguments."""
    text = json.dumps([name, arguments], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def judge(occurrence: int, policy: ToolLoopPolicy) -> RepeatVerdict:
    """What the ``occurrence``-th identical call of the run gets (higher thresholds win)."""
    if occurrence >= policy.escalateAt:
        return RepeatVerdict.ESCALATE
    if occurrence >= policy.blockAt:
        return RepeatVerdict.BLOCK
    if occurrence >= policy.warnAt:
        return RepeatVerdict.WARN
    return RepeatVerdict.OK


def occurrence(run_id: uuid.UUID, digest: str) -> int:
    """This call's occurrence number: earlier tool steps of the run with the same hash, + 1."""
    return LoopStep.objects.filter(run_id=run_id, kind="tool", call_hash=digest).count() + 1


def warning_notice(name: str, count: int, policy: ToolLoopPolicy) -> str:
    return (
        f"[run notice: {name!r} has now been called {count} times in this run with exactly "
        f"these arguments. From {policy.blockAt} such calls the run refuses it and at "
        f"{policy.escalateAt} a human takes over: change your approach or finish.]"
    )


def block_message(name: str, count: int, policy: ToolLoopPolicy) -> str:
    return (
        f"Error: blocked by the run's tool-loop policy: {name!r} was called {count} times in "
        f"this run with exactly these arguments (blockAt {policy.blockAt}). The call was not "
        "executed; use the results you already have or change your approach."
    )


def escalation(name: str, count: int, policy: ToolLoopPolicy) -> ToolLoopEscalated:
    reason = (
        f"The run called {name!r} {count} times with exactly the same arguments "
        f"(toolLoop.escalateAt {policy.escalateAt}); a human has to look at it."
    )
    return ToolLoopEscalated(
        reason,
        code="tool_loop",
        data={"tool": name, "count": count, "escalateAt": policy.escalateAt},
    )


def event_data(name: str, count: int, policy: ToolLoopPolicy, seq: int) -> dict[str, Any]:
    return {
        "tool": name,
        "count": count,
        "seq": seq,
        "warnAt": policy.warnAt,
        "blockAt": policy.blockAt,
        "escalateAt": policy.escalateAt,
    }

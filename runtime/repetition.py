"""Repetition protection (pure): identical calls and long runs of the same tool.

Two layers (docs/tool-loop.md): a call with the same tool and the same canonical arguments is
skipped from its 3rd occurrence (the model is told to reuse the result); the same tool called
consecutively, whatever the arguments, warns at 5 calls and forces finalisation at 7.

"Consecutively" is counted per model step: calls of one tool made in parallel within a step
(reading eight files at once) are one decision of the model and count once, while a step that
calls another tool breaks the run. What the guard catches is a model that keeps coming back to
the same tool step after step.

The tracker is a value folded over every tool call the model made, in order. The loop rebuilds
it from the persisted model steps on resume, so the counters survive a crash or a park. Its
counts are a persistent map (a HAMT): counting a call costs O(log n), not a copy of every
signature seen so far (that copy made a resume's replay quadratic in the history).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import immutables


class Repetition(enum.StrEnum):
    OK = "ok"
    WARN = "warn"
    DUPLICATE = "duplicate"
    FINALIZE = "finalize"


@dataclass(frozen=True)
class RepetitionLimits:
    duplicate_skip_at: int = 3
    consecutive_warn_at: int = 5
    consecutive_finalize_at: int = 7


@dataclass(frozen=True)
class RepetitionState:
    #: Occurrences of each (tool, canonical arguments) signature so far.
    seen: immutables.Map[str, int] = field(default_factory=immutables.Map)
    last_tool: str = ""
    #: The model step in which ``last_tool`` was last counted.
    last_step: int = -1
    streak: int = 0


@dataclass(frozen=True)
class Observation:
    state: RepetitionState
    verdict: Repetition
    occurrences: int
    streak: int


def signature(tool: str, canonical_arguments: str) -> str:
    return f"{tool}\x00{canonical_arguments}"


def _streak(state: RepetitionState, tool: str, step: int) -> int:
    if tool != state.last_tool:
        return 1
    return state.streak if step == state.last_step else state.streak + 1


def observe(
    state: RepetitionState,
    tool: str,
    canonical_arguments: str,
    limits: RepetitionLimits,
    *,
    step: int,
) -> Observation:
    """Count one call of model step ``step`` and say what to do with it (finalisation outranks
    a duplicate)."""
    key = signature(tool, canonical_arguments)
    occurrences = state.seen.get(key, 0) + 1
    streak = _streak(state, tool, step)
    seen = state.seen.set(key, occurrences)
    new_state = RepetitionState(seen=seen, last_tool=tool, last_step=step, streak=streak)
    if streak >= limits.consecutive_finalize_at:
        verdict = Repetition.FINALIZE
    elif occurrences >= limits.duplicate_skip_at:
        verdict = Repetition.DUPLICATE
    elif streak >= limits.consecutive_warn_at:
        verdict = Repetition.WARN
    else:
        verdict = Repetition.OK
    return Observation(new_state, verdict, occurrences, streak)


def duplicate_message(tool: str, occurrences: int) -> str:
    return (
        f"Not executed: this is call number {occurrences} of {tool!r} with exactly these "
        "arguments. Reuse the result you already received, or change your approach."
    )


def warning_message(tool: str, streak: int, limits: RepetitionLimits) -> str:
    return (
        f"[warning: {tool!r} has been called in {streak} steps in a row. At "
        f"{limits.consecutive_finalize_at} consecutive calls the loop stops and asks for a "
        "final answer: change your approach or finish.]"
    )


def finalize_message(tool: str, streak: int) -> str:
    return (
        f"Not executed: {tool!r} was called in {streak} steps in a row, so the loop is finishing. "
        "Summarise what you completed, what is incomplete and the recommended next steps."
    )

"""The run state machine: one table of allowed transitions, pure and database-free.

``queued → preparing → waiting_lock → running → waiting_approval → verifying → waiting_human →
succeeded | failed | canceled``, plus ``paused`` and ``blocked`` (docs/runs.md). Parked states
(waiting_approval, waiting_human, paused, blocked) hold no lease; a parked run that may go on is
put back to ``queued`` and claimed like a new one.
"""

from __future__ import annotations

from dataclasses import dataclass

from loops.models import RunStatus as S

TERMINAL: frozenset[S] = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELED})
#: States a worker may claim from.
CLAIMABLE: frozenset[S] = frozenset({S.QUEUED, S.WAITING_LOCK})
#: States in which a worker holds the lease and drives the run.
ACTIVE: frozenset[S] = frozenset({S.PREPARING, S.RUNNING, S.VERIFYING})
#: Started, unfinished, and counted against the pattern's concurrency limit.
IN_FLIGHT: frozenset[S] = frozenset(
    {S.PREPARING, S.WAITING_LOCK, S.RUNNING, S.WAITING_APPROVAL, S.VERIFYING}
)
PARKED: frozenset[S] = frozenset({S.WAITING_APPROVAL, S.WAITING_HUMAN, S.PAUSED, S.BLOCKED})

_NON_TERMINAL = frozenset(S) - TERMINAL

TRANSITIONS: dict[S, frozenset[S]] = {
    S.QUEUED: frozenset({S.PREPARING, S.PAUSED, S.CANCELED, S.FAILED}),
    S.PREPARING: frozenset(
        {
            S.WAITING_LOCK,
            S.RUNNING,
            S.VERIFYING,
            S.QUEUED,
            S.PAUSED,
            S.BLOCKED,
            S.FAILED,
            S.CANCELED,
        }
    ),
    S.WAITING_LOCK: frozenset({S.PREPARING, S.QUEUED, S.PAUSED, S.FAILED, S.CANCELED}),
    S.RUNNING: frozenset(
        {
            S.WAITING_APPROVAL,
            S.VERIFYING,
            S.WAITING_HUMAN,
            S.QUEUED,
            S.PAUSED,
            S.BLOCKED,
            S.SUCCEEDED,
            S.FAILED,
            S.CANCELED,
        }
    ),
    S.WAITING_APPROVAL: frozenset({S.QUEUED, S.WAITING_HUMAN, S.PAUSED, S.FAILED, S.CANCELED}),
    S.VERIFYING: frozenset(
        {S.SUCCEEDED, S.FAILED, S.WAITING_HUMAN, S.QUEUED, S.PAUSED, S.BLOCKED, S.CANCELED}
    ),
    S.WAITING_HUMAN: frozenset({S.SUCCEEDED, S.FAILED, S.QUEUED, S.CANCELED}),
    S.PAUSED: frozenset({S.QUEUED, S.CANCELED, S.WAITING_HUMAN}),
    S.BLOCKED: frozenset({S.QUEUED, S.WAITING_HUMAN, S.FAILED, S.CANCELED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELED: frozenset(),
}


class TransitionRefused(Exception):
    """A transition that the table does not allow, or whose guard failed."""

    def __init__(self, current: str, target: str, detail: str = "") -> None:
        self.current = current
        self.target = target
        super().__init__(detail or f"A run in state '{current}' cannot move to '{target}'.")


def can_transition(current: str, target: str) -> bool:
    return S(target) in TRANSITIONS[S(current)]


def sources_of(target: S) -> frozenset[S]:
    """Every state from which ``target`` may be reached."""
    return frozenset(src for src, targets in TRANSITIONS.items() if target in targets)


@dataclass(frozen=True)
class HumanAction:
    """A human action on a run: the state it leads to and where it is allowed."""

    name: str
    target: S
    allowed_from: frozenset[S]
    event_type: str


HUMAN_ACTIONS: dict[str, HumanAction] = {
    "pause": HumanAction(
        "pause",
        S.PAUSED,
        frozenset(
            {S.QUEUED, S.PREPARING, S.WAITING_LOCK, S.RUNNING, S.WAITING_APPROVAL, S.VERIFYING}
        ),
        "run.paused",
    ),
    "resume": HumanAction("resume", S.QUEUED, frozenset({S.PAUSED, S.BLOCKED}), "run.resumed"),
    "cancel": HumanAction("cancel", S.CANCELED, _NON_TERMINAL, "run.canceled"),
    "escalate": HumanAction(
        "escalate",
        S.WAITING_HUMAN,
        frozenset({S.RUNNING, S.WAITING_APPROVAL, S.VERIFYING, S.PAUSED, S.BLOCKED}),
        "run.escalated",
    ),
    "accept": HumanAction("accept", S.SUCCEEDED, frozenset({S.WAITING_HUMAN}), "run.accepted"),
}
#: ``retry`` starts a new run from a failed or canceled one; the original stays as it was.
RETRYABLE: frozenset[S] = frozenset({S.FAILED, S.CANCELED})


def allowed_actions(status: str) -> list[str]:
    """Human actions that make sense in ``status`` (the UI shows only these)."""
    current = S(status)
    names = [name for name, action in HUMAN_ACTIONS.items() if current in action.allowed_from]
    if current in RETRYABLE:
        names.append("retry")
    return names


def _check_table() -> None:
    for action in HUMAN_ACTIONS.values():
        for source in action.allowed_from:
            if action.target not in TRANSITIONS[source]:
                raise AssertionError(f"{action.name}: {source} -> {action.target} not in table")


_check_table()

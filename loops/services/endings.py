"""A run's end: what ending a run touches besides its row, owned here and nowhere else.

Every transition to a terminal state goes through :func:`run_transition` of this module, which
hands :func:`run_end` to the transition. In the transaction that ends the run, with its row
locked, the end frees the run's path locks (waking runs waiting for them), withdraws its
pending approvals (the queue never shows a dead run's approvals) and counts the outcome on the
pattern's breaker. A lease holder's end takes the one-statement path only when all of that
would write nothing (``transitions._ENDS_CLEANLY``, tied to this rule by
tests/loops/test_run_endings.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from django.db import transaction

from loops import state
from loops.models import RunStatus
from loops.services import transitions
from loops.services.approvals import approvals_withdraw
from loops.services.breakers import breaker_record_outcome, breaker_summary
from loops.services.locks import path_locks_release
from loops.services.transitions import Lease, TransitionResult
from orchestrator.metrics import RUNS_ENDED


def run_end(*, run_id: uuid.UUID, pattern_id: int, actor: str, status: RunStatus) -> dict[str, Any]:
    """Free, withdraw and count what the run's end to ``status`` touches; returns what the
    end's event records of it (``withdrawn_approvals``, ``breaker``)."""
    path_locks_release(run_id=run_id)
    recorded: dict[str, Any] = {}
    withdrawn = approvals_withdraw(run_id=run_id, actor=actor, status=status.value)
    if withdrawn:
        recorded["withdrawn_approvals"] = withdrawn
    changed = breaker_record_outcome(pattern_id=pattern_id, run_id=run_id, status=status)
    if changed is not None:
        recorded["breaker"] = breaker_summary(changed)
    return recorded


def run_transition(
    *,
    run_id: uuid.UUID,
    to: RunStatus,
    actor: str,
    event_type: str = "status.changed",
    lease: Lease | None = None,
    expected_from: Iterable[RunStatus] | None = None,
    data: dict[str, Any] | None = None,
    fields: dict[str, Any] | None = None,
) -> TransitionResult:
    """:func:`transitions.run_transition` for a caller whose transition may end the run; an
    end is counted (``loopwright_runs_ended_total``) once it commits."""
    result = transitions.run_transition(
        run_id=run_id,
        to=to,
        actor=actor,
        event_type=event_type,
        lease=lease,
        expected_from=expected_from,
        data=data,
        fields=fields,
        on_end=run_end,
    )
    if to in state.TERMINAL:
        # The reason the row records (transitions._values falls back to the event type).
        reason = str((fields or {}).get("terminal_reason") or event_type.replace(".", "_"))[:60]
        transaction.on_commit(RUNS_ENDED.labels(status=to.value, reason=reason).inc)
    return result

"""A run's end (loops.services.endings): the one-statement path of a lease holder's end
(``transitions._ENDS_CLEANLY``, SQL) is taken exactly when the Python rule says the end writes
nothing besides the run (no path lock, no pending approval, ``breakers.records_nothing``), and
the end looks the same on either path. A change to one rule without the other fails here."""

from __future__ import annotations

import itertools
import uuid
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.db import connection
from django.utils import timezone

from loops import db
from loops.models import (
    ActionApproval,
    ApprovalStatus,
    CircuitState,
    LoopEvent,
    LoopRun,
    LoopStep,
    PathLock,
    RunStatus,
    StepKind,
    StepStatus,
)
from loops.services import transitions
from loops.services.breakers import breaker_read, key_of, outcome_of, records_nothing
from loops.services.claims import run_claim
from loops.services.endings import run_transition
from loops.services.transitions import Lease
from tests.support.claims import start_claimed
from tests.support.factories import make_pattern, make_run

pytestmark = pytest.mark.django_db(transaction=True)

#: The pattern breaker before the end (None: no row yet); ``probe`` "run" is the ending run.
BREAKERS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "closed": {"state": "closed", "consecutive_failures": 0},
    "closed after failures": {"state": "closed", "consecutive_failures": 2},
    "open": {"state": "open", "consecutive_failures": 5, "opened_at": timezone.now()},
    "probing this run": {"state": "half_open", "consecutive_failures": 5, "probe": "run"},
    "probing another run": {"state": "half_open", "consecutive_failures": 5, "probe": "other"},
}
ENDS = [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELED]


def _running(breaker: dict[str, Any] | None, locked: bool, pending: bool) -> Lease:
    pattern = make_pattern()
    run = make_run(pattern)
    [claim] = run_claim(owner="ending", lease_seconds=300, run_id=run.id)
    start_claimed(claim)
    if breaker is not None:
        fields = {k: v for k, v in breaker.items() if k != "probe"}
        probe = {"run": str(run.id), "other": str(uuid.uuid4())}.get(breaker.get("probe", ""), "")
        CircuitState.objects.create(key=key_of(pattern.key), probe_owner=probe, **fields)
    if locked:
        PathLock.objects.create(run=run, repository_key=f"repo-{run.id}", path="src")
    if pending:
        _gated_call(run)
    return claim.lease


def _gated_call(run: LoopRun) -> None:
    LoopStep.objects.create(
        run=run,
        seq=1,
        role="maker",
        invocation="maker:0",
        kind=StepKind.TOOL,
        status=StepStatus.GATED,
        name="write",
    )
    ActionApproval.objects.create(
        run=run,
        step_seq=1,
        role="maker",
        invocation="maker:0",
        tool_name="write",
        proposal_hash="0" * 64,
        expires_at=timezone.now() + timedelta(hours=1),
    )


def _writes_nothing(lease: Lease, status: RunStatus) -> bool:
    """The Python rule: what ``endings.run_end`` would write nothing for."""
    run = LoopRun.objects.select_related("pattern").get(pk=lease.run_id)
    breaker = breaker_read(run.pattern)
    return (
        not PathLock.objects.filter(run_id=lease.run_id).exists()
        and not ActionApproval.objects.filter(
            run_id=lease.run_id, status=ApprovalStatus.PENDING
        ).exists()
        and records_nothing(breaker, outcome_of(status), str(lease.run_id))
    )


def _end(lease: Lease, status: RunStatus) -> bool:
    """End the run as its lease holder; True when the one-statement path did it."""
    exact = mock.patch.object(
        transitions, "_run_transition_exact", wraps=transitions._run_transition_exact
    )
    with exact as spy:
        run_transition(
            run_id=lease.run_id, to=status, actor=lease.owner, lease=lease, event_type="t.end"
        )
    return spy.call_count == 0


def _end_state(lease: Lease) -> dict[str, Any]:
    """What the end left, with the run's own ids replaced by names."""
    run = LoopRun.objects.select_related("pattern").get(pk=lease.run_id)
    row = CircuitState.objects.filter(key=key_of(run.pattern.key)).first()
    event = LoopEvent.objects.filter(run_id=run.id).order_by("-seq").first()
    assert event is not None
    return {
        "run": (run.status, run.terminal_reason, run.lease_owner, run.lease_token, run.attempts),
        "finished": run.finished_at is not None,
        "event": (event.type, event.from_status, event.to_status, _timeless(event.data)),
        "locks": PathLock.objects.filter(run_id=run.id).count(),
        "approvals": sorted(
            ActionApproval.objects.filter(run=run).values_list("status", flat=True)
        ),
        "breaker": None
        if row is None
        else (
            row.state,
            row.consecutive_failures,
            row.opened_at is not None,
            "run" if row.probe_owner == str(run.id) else bool(row.probe_owner),
        ),
    }


def _timeless(data: dict[str, Any]) -> dict[str, Any]:
    """An end's event data with the breaker's reopening time reduced to whether it has one."""
    breaker = data.get("breaker")
    if breaker is None:
        return data
    return {**data, "breaker": {**breaker, "open_until": breaker["open_until"] is not None}}


CASES = list(itertools.product(BREAKERS, ENDS, (False, True), (False, True)))


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the one-statement end is PostgreSQL's"
)
def test_an_end_takes_the_one_statement_path_exactly_when_it_writes_nothing_else() -> None:
    mismatched, differing, clean_ends = [], [], 0
    for breaker, status, locked, pending in CASES:
        case = (breaker, status.value, locked, pending)
        lease = _running(BREAKERS[breaker], locked, pending)
        clean = _writes_nothing(lease, status)
        clean_ends += clean
        if _end(lease, status) != clean:
            mismatched.append((case, f"Python rule says clean={clean}"))
        with db.exact_path_forced():
            exact = _running(BREAKERS[breaker], locked, pending)
            assert not _end(exact, status)
        if _end_state(lease) != _end_state(exact):
            differing.append((case, _end_state(lease), _end_state(exact)))
    assert not mismatched, mismatched
    assert not differing, differing
    assert 0 < clean_ends < len(CASES)  # the grid holds ends of both kinds


def test_an_end_without_its_side_effects_is_refused() -> None:
    lease = _running(None, locked=True, pending=False)
    with pytest.raises(ValueError, match="on_end"):
        transitions.run_transition(
            run_id=lease.run_id, to=RunStatus.FAILED, actor=lease.owner, lease=lease
        )
    assert LoopRun.objects.get(pk=lease.run_id).status == RunStatus.RUNNING
    assert PathLock.objects.filter(run_id=lease.run_id).exists()


def test_an_exact_end_frees_locks_withdraws_approvals_and_counts_the_failure() -> None:
    lease = _running({"state": "closed", "consecutive_failures": 0}, locked=True, pending=True)
    run_transition(run_id=lease.run_id, to=RunStatus.FAILED, actor=lease.owner, lease=lease)
    state = _end_state(lease)
    assert state["locks"] == 0
    assert state["approvals"] == [ApprovalStatus.WITHDRAWN]
    assert state["breaker"] == ("closed", 1, False, False)
    assert state["event"][3]["withdrawn_approvals"] == 1

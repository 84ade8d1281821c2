"""An invocation's start: counted once, in one round trip when the caller's limits still hold.

The engine hands each invocation's start the run's limits as it last read them (from the claim
for the first, from the journal's latest write after that). On PostgreSQL the start is then one
statement that proves those limits unchanged; a run whose limits changed meanwhile is judged
by the path that reads them first, so a stale reading never lets a start through that a limit
refuses. On SQLite every start takes the exact path: the same answers, no round-trip figures.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from loops import db
from loops.models import LoopEvent, LoopRun, LoopStep, UsageBucket
from loops.policy import PatternPolicy
from loops.services import budget_rules, budgets
from loops.services.claims import run_claim
from loops.services.steps import call_counts, invocation_begin, step_begin
from loops.services.tool_repeats import call_hash
from loops.services.transitions import Lease
from loops.worker.engine import run_state_of
from runtime.invocation import BudgetExhausted, LeaseLost
from tests.support.factories import make_pattern, make_run

# Real transactions: on PostgreSQL the start is sent as one batch.
pytestmark = pytest.mark.django_db(transaction=True)


def _claimed(policy: dict[str, Any] | None = None) -> tuple[Lease, budget_rules.RunLimits]:
    """A claimed run and its limits as the engine has them after the claim."""
    pattern = make_pattern(policy=policy or {})
    snapshot = PatternPolicy.model_validate(policy or {}).model_dump()
    run = make_run(pattern, policy_snapshot=snapshot)
    [claim] = run_claim(owner="start-test", lease_seconds=300, run_id=run.id)
    if claim.columns is not None:  # PostgreSQL's one-statement claim returns them
        limits = run_state_of(run.id, claim.status, claim.columns).limits
        assert limits is not None
        return claim.lease, limits
    return claim.lease, budgets.fenced_limits(claim.lease)[2]


def _starts(lease: Lease, invocation: str) -> int:
    return LoopEvent.objects.filter(
        run_id=lease.run_id, type="invocation.started", data__invocation=invocation
    ).count()


def _counted(lease: Lease, metric: str = "invocations") -> int:
    bucket = UsageBucket.objects.filter(scope=f"run:{lease.run_id}", metric=metric).first()
    return 0 if bucket is None else int(bucket.value)


def _round_trips(call: Any) -> tuple[Any, int]:
    before = db.round_trips()
    result = call()
    return result, db.round_trips() - before


def _postgres() -> bool:
    return connection.vendor == "postgresql"


def test_the_first_start_with_the_claims_limits_is_one_round_trip() -> None:
    lease, limits = _claimed()
    if _postgres():
        # The claim's texts give the same fingerprint the database proves.
        assert limits.fingerprint == budgets.fenced_limits(lease)[2].fingerprint
    (start, calls), trips = _round_trips(
        lambda: invocation_begin(lease, role="maker", invocation="maker:0", expected=limits)
    )
    assert (start.started, start.metered, start.steps, calls) == (True, False, 0, {})
    assert start.limits is not None and start.limits.fingerprint == limits.fingerprint
    assert _starts(lease, "maker:0") == 1
    assert _counted(lease) == 1
    pattern_id = LoopRun.objects.get(pk=lease.run_id).pattern_id
    day = UsageBucket.objects.get(
        scope=budget_rules.daily_scope(pattern_id, timezone.now()), metric="invocations"
    )
    assert int(day.value) == 1
    event = LoopEvent.objects.get(run_id=lease.run_id, type="invocation.started")
    assert event.seq == LoopRun.objects.get(pk=lease.run_id).event_seq
    assert event.data == {"invocation": "maker:0", "role": "maker"}
    if _postgres():
        assert trips == 1


def test_a_verifier_start_counts_a_verification_too() -> None:
    lease, limits = _claimed()
    invocation_begin(lease, role="verifier", invocation="verifier", expected=limits)
    assert (_counted(lease), _counted(lease, "verifications")) == (1, 1)


def test_a_resumed_invocation_is_not_counted_again_and_gets_the_runs_repeated_calls() -> None:
    lease, limits = _claimed()
    invocation_begin(lease, role="maker", invocation="maker:0", expected=limits)
    for path in ("a.txt", "b.txt", "b.txt"):
        step_begin(
            lease, role="maker", invocation="maker:0", kind="tool", name="read_file",
            request={"arguments": {"path": path}},
        )  # fmt: skip
    (start, calls), trips = _round_trips(
        lambda: invocation_begin(lease, role="maker", invocation="maker:0", expected=limits)
    )
    assert (start.started, start.steps) == (False, 3)
    # Only the call made twice is listed (a call made once is not read at each start).
    assert calls == call_counts(lease.run_id) == {call_hash("read_file", {"path": "b.txt"}): 2}
    assert (_starts(lease, "maker:0"), _counted(lease)) == (1, 1)
    if _postgres():
        assert trips == 1


def test_limits_that_changed_since_they_were_read_are_judged_before_the_start() -> None:
    """The caller read the run's limits when nothing bound invocations; the pattern's daily
    budget now allows one, and one was used: the stale reading must not start another."""
    lease, stale = _claimed()
    invocation_begin(lease, role="leader", invocation="leader", expected=stale)
    pattern = LoopRun.objects.get(pk=lease.run_id).pattern
    pattern.policy = {"budgets": {"daily": {"invocations": 1}}}
    pattern.save(update_fields=["policy"])
    with pytest.raises(BudgetExhausted):
        invocation_begin(lease, role="maker", invocation="maker:0", expected=stale)
    assert _starts(lease, "maker:0") == 0
    assert _counted(lease) == 1


def test_a_start_whose_limits_changed_harmlessly_is_still_counted_once() -> None:
    lease, stale = _claimed({"budgets": {"perRun": {"toolCalls": 10}}})
    budgets.run_budget_raise(run_id=lease.run_id, per_run={"toolCalls": 1000}, actor="ops")
    (start, _), trips = _round_trips(
        lambda: invocation_begin(lease, role="maker", invocation="maker:0", expected=stale)
    )
    assert start.started and start.limits is not None
    assert start.limits.fingerprint != stale.fingerprint
    assert (_starts(lease, "maker:0"), _counted(lease)) == (1, 1)
    if _postgres():
        assert trips == 3  # the proof failed (nothing written), then the reading path


def test_a_start_by_a_holder_that_lost_its_lease_writes_nothing() -> None:
    lease, limits = _claimed()
    LoopRun.objects.filter(pk=lease.run_id).update(lease_token=lease.token + 1)
    with pytest.raises(LeaseLost):
        invocation_begin(lease, role="maker", invocation="maker:0", expected=limits)
    assert (_starts(lease, "maker:0"), _counted(lease)) == (0, 0)
    assert not LoopStep.objects.filter(run_id=lease.run_id).exists()


def test_a_metered_run_takes_the_path_that_judges_its_start() -> None:
    lease, limits = _claimed({"budgets": {"perRun": {"tokens": 1000}}})
    (start, _), trips = _round_trips(
        lambda: invocation_begin(lease, role="maker", invocation="maker:0", expected=limits)
    )
    assert start.started and start.metered
    assert (_starts(lease, "maker:0"), _counted(lease)) == (1, 1)
    if _postgres():
        assert trips == 1  # no one-statement try; the reading batch, then the judging path

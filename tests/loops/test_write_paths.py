"""Each write with a fast path, run on both paths (``write_path``): the same rows either way,
and the path the test asked for is the one taken (round trips of batches sent together on the
fast path, none on the exact one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.utils import timezone

from loops import db
from loops.models import LoopEvent, LoopRun, LoopStep, UsageBucket
from loops.services.claims import run_claim
from loops.services.step_records import finished_step
from loops.services.steps import invocation_begin, step_complete, tool_step_begin, tool_step_record
from loops.services.transitions import Lease
from orchestrator.sql import is_postgres
from runtime.invocation import BudgetExhausted
from tests.support.factories import make_pattern, make_run
from tests.support.limits import snapshot, tool_request
from tests.support.write_paths import FAST, both_write_paths


@pytest.fixture(autouse=True)
def _round_trips_tell_the_path(write_path: str) -> None:
    """Which path ran is read from round trips of batches sent together: PostgreSQL's."""
    if write_path == FAST and not is_postgres():
        pytest.skip("batches travel together only on PostgreSQL (SQLite runs them one by one)")


def _claimed(policy: dict[str, Any] | None = None) -> Lease:
    run = make_run(make_pattern(policy=policy or {}), policy_snapshot=snapshot(policy or {}))
    [claim] = run_claim(owner="paths", lease_seconds=300, run_id=run.id)
    return claim.lease


def _trips(write: Callable[[], Any]) -> tuple[Any, int]:
    before = db.round_trips()
    result = write()
    return result, db.round_trips() - before


def _took(path: str, trips: int) -> bool:
    """The fast path sends its batches together (round trips); the exact one sends none."""
    return trips > 0 if path == FAST else trips == 0


def _used(lease: Lease, metric: str) -> int:
    bucket = UsageBucket.objects.filter(scope=f"run:{lease.run_id}", metric=metric).first()
    return 0 if bucket is None else int(bucket.value)


@both_write_paths
def test_an_invocation_starts_once_and_is_counted_once(write_path: str) -> None:
    lease = _claimed()
    (start, calls), trips = _trips(
        lambda: invocation_begin(lease, role="verifier", invocation="verifier:0")
    )
    again, _ = invocation_begin(lease, role="verifier", invocation="verifier:0")
    assert (start.started, again.started, calls) == (True, False, {})
    assert LoopEvent.objects.filter(run_id=lease.run_id, type="invocation.started").count() == 1
    assert (_used(lease, "invocations"), _used(lease, "verifications")) == (1, 1)
    assert _took(write_path, trips)


@both_write_paths
def test_a_plain_tool_call_is_begun_and_counted(write_path: str) -> None:
    lease = _claimed()
    model = finished_step(
        lease,
        role="maker",
        invocation="maker:0",
        kind="model",
        name="m",
        request={},
        response={"content": ""},
        tokens_in=3,
        tokens_out=2,
        seq=1,
    )
    start, trips = _trips(
        lambda: tool_step_begin(
            lease,
            role="maker",
            invocation="maker:0",
            name="read",
            request=tool_request({"n": 1}),
            model_step=model,
        )
    )
    assert (start.seq, start.refused, start.notice) == (2, "", "")
    steps = LoopStep.objects.filter(run_id=lease.run_id).order_by("seq")
    assert [(s.seq, s.kind, s.status) for s in steps] == [
        (1, "model", "completed"),
        (2, "tool", "started"),
    ]
    assert (_used(lease, "toolCalls"), _used(lease, "tokens")) == (1, 5)
    assert LoopRun.objects.get(pk=lease.run_id).step_count == 2
    assert _took(write_path, trips)


@both_write_paths
def test_a_begun_call_is_completed(write_path: str) -> None:
    lease = _claimed()
    start = tool_step_begin(
        lease, role="maker", invocation="maker:0", name="write", request=tool_request({})
    )
    assert start.started_at is not None
    _, trips = _trips(
        lambda: step_complete(
            lease, start.seq, response={"content": "ok"}, started_at=start.started_at
        )
    )
    step = LoopStep.objects.get(run_id=lease.run_id, seq=start.seq)
    assert (step.status, step.response) == ("completed", {"content": "ok"})
    assert _took(write_path, trips)


@both_write_paths
def test_a_read_is_recorded_finished_or_begun_when_it_has_something_to_judge(
    write_path: str,
) -> None:
    lease = _claimed()
    request = tool_request({"path": "a"})
    started = timezone.now()
    record = tool_step_record(
        lease,
        role="maker",
        invocation="maker:0",
        name="read",
        request=request,
        idempotency_key="",
        response={"content": "a"},
        error="",
        started_at=started,
    )
    step = LoopStep.objects.get(run_id=lease.run_id, seq=record.seq)
    # The fast path writes the read finished; the exact one begins it (the caller completes it).
    finished = write_path == FAST
    assert step.status == ("completed" if finished else "started")
    assert (record.started_at is None) == finished
    assert _used(lease, "toolCalls") == 1


@both_write_paths
def test_a_call_a_limit_judges_takes_the_exact_path_and_is_refused_past_it(
    write_path: str,
) -> None:
    lease = _claimed({"budgets": {"perRun": {"toolCalls": 1}}})
    first = tool_step_begin(
        lease, role="maker", invocation="maker:0", name="read", request=tool_request({"n": 1})
    )
    with pytest.raises(BudgetExhausted):
        tool_step_begin(
            lease, role="maker", invocation="maker:0", name="read", request=tool_request({"n": 2})
        )
    assert first.seq == 1
    assert LoopStep.objects.filter(run_id=lease.run_id).count() == 1
    assert _used(lease, "toolCalls") == 1


@both_write_paths
def test_a_claim_leases_the_run_and_logs_it(write_path: str) -> None:
    run = make_run()
    [claim] = run_claim(owner="paths", lease_seconds=60, run_id=run.id)
    run.refresh_from_db()
    assert (run.lease_owner, run.lease_token, claim.lease.token) == ("paths", 1, 1)
    claimed = LoopEvent.objects.get(run=run, type="lease.claimed")
    assert claimed.data == {"token": 1, "attempt": 1}
    # The one-statement claim (fast) also starts a run that needs no preparation.
    assert claim.status == ("running" if write_path == FAST else "preparing")

"""The engine's journal numbers model steps itself and writes each with its next write.

Only the lease holder writes a run's steps, so its journal knows the next seq: a model step is
written in the same transaction as the first call it made (or alone, when the journal is
flushed), never under a seq another writer took. Reads run first only while no limit of the
run must judge them before they run.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any
from unittest import mock

import pytest
from django.db import DEFAULT_DB_ALIAS, connections
from django.test.utils import CaptureQueriesContext

from loops import db
from loops.models import LoopPattern, LoopRun, LoopStep, UsageBucket
from loops.policy import PatternPolicy
from loops.services import budget_rules
from loops.services.claims import run_claim
from loops.services.step_records import JournalOutOfStep
from loops.services.steps import step_begin
from loops.services.transitions import Lease
from loops.worker.engine import _invocation_begin
from loops.worker.journal import DbJournal
from runtime.invocation import BudgetExhausted, LeaseLost, LoopRole
from tests.support.factories import make_pattern, make_run

# Real transactions: on PostgreSQL the journal sends each write as one multi-statement batch.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("seeded_profiles")]


class InlineDriver:
    async def db(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)


def leased(policy: dict[str, Any] | None = None) -> Lease:
    pattern = make_pattern(policy=policy or {})
    run = make_run(pattern, policy_snapshot=PatternPolicy.model_validate(policy or {}).model_dump())
    [claim] = run_claim(owner="journal-test", lease_seconds=300, run_id=run.id)
    return claim.lease


def journal_for(lease: Lease) -> DbJournal:
    journal = DbJournal(InlineDriver(), lease, LoopRole.MAKER, "maker:0")  # type: ignore[arg-type]
    start, calls = _invocation_begin(lease, LoopRole.MAKER, "maker:0")
    journal.started(
        fresh=start.started,
        metered=start.metered,
        steps=start.steps,
        limits=start.limits,
        calls=calls,
    )
    return journal


def run_async(coroutine: Any) -> Any:
    outer = connections[DEFAULT_DB_ALIAS]

    async def main() -> Any:
        connections[DEFAULT_DB_ALIAS] = outer  # the test's transaction
        return await coroutine

    with mock.patch.dict(os.environ, {"DJANGO_ALLOW_ASYNC_UNSAFE": "true"}):
        return asyncio.run(main())


def record_model_step(journal: DbJournal) -> int:
    return run_async(
        journal.record(
            kind="model",
            name="model",
            request={"step": 1},
            response={"message": {"role": "assistant", "content": ""}},
            tokens_in=3,
            tokens_out=2,
        )
    )


def test_a_model_step_is_written_with_the_first_call_it_made() -> None:
    lease = leased()
    journal = journal_for(lease)
    model_seq = record_model_step(journal)
    assert not LoopStep.objects.filter(run_id=lease.run_id, seq=model_seq).exists()

    request = {"arguments": {"path": "a"}}
    tool_seq = run_async(
        journal.begin(kind="tool", name="write", request=request, idempotency_key="k")
    )
    steps = dict(LoopStep.objects.filter(run_id=lease.run_id).values_list("seq", "kind"))
    assert steps == {model_seq: "model", tool_seq: "tool"} and tool_seq == model_seq + 1


def test_the_final_answer_is_written_when_the_journal_is_flushed() -> None:
    lease = leased()
    journal = journal_for(lease)
    seq = record_model_step(journal)
    run_async(journal.flush())
    step = LoopStep.objects.get(run_id=lease.run_id, seq=seq)
    assert (step.kind, step.status, step.tokens_in, step.tokens_out) == ("model", "completed", 3, 2)


def test_a_model_step_is_never_written_under_a_seq_another_writer_took() -> None:
    lease = leased()
    journal = journal_for(lease)
    seq = record_model_step(journal)
    # Something else wrote a step of the run meanwhile (only the lease holder may: a bug).
    taken = step_begin(lease, role="maker", invocation="other", kind="tool", name="x", request={})
    assert taken == seq

    with pytest.raises(JournalOutOfStep, match=f"numbered step {seq}"):
        run_async(journal.begin(kind="tool", name="write", request={}, idempotency_key="k"))
    assert list(
        LoopStep.objects.filter(run_id=lease.run_id).values_list("invocation", flat=True)
    ) == ["other"]


def test_reads_run_first_only_while_no_limit_of_the_run_must_judge_them() -> None:
    call = {"arguments": {"path": "a"}}
    assert journal_for(leased()).runs_first("read", call)
    budgeted = leased({"budgets": {"perRun": {"toolCalls": 50}}})
    assert not journal_for(budgeted).runs_first("read", call)
    metered = leased({"budgets": {"daily": {"tokens": 10_000}}})
    assert not journal_for(metered).runs_first("read", call)


def test_a_repeated_read_is_begun_first_once_the_tool_loop_policy_counts_it() -> None:
    lease = leased({"toolLoop": {"warnAt": 3, "blockAt": 4, "escalateAt": 5}})
    journal = journal_for(lease)
    call = {"arguments": {"path": "same"}}
    for _ in range(2):
        assert journal.runs_first("read", call)
        record_model_step(journal)
        run_async(
            journal.record_call(
                name="read", request=call, idempotency_key="k", response={"content": "x"}
            )
        )
    assert not journal.runs_first("read", call)  # the 3rd identical call gets a warning
    assert journal.runs_first("read", {"arguments": {"path": "other"}})


def test_a_resumed_journal_knows_the_repeated_calls_and_bounds_the_others() -> None:
    lease = leased({"toolLoop": {"warnAt": 3, "blockAt": 4, "escalateAt": 5}})
    first = journal_for(lease)
    for path in ("once", "twice", "twice"):
        read_step(first, path)
    run_async(first.flush())
    resumed = journal_for(lease)  # its start lists only the call made twice
    assert not resumed.runs_first("read", {"arguments": {"path": "twice"}})  # the 3rd: warned
    assert resumed.runs_first("read", {"arguments": {"path": "once"}})  # made at most once
    assert resumed.runs_first("read", {"arguments": {"path": "never"}})
    read_step(resumed, "once")
    assert not resumed.runs_first("read", {"arguments": {"path": "once"}})  # the 3rd: warned


# --- the one-round-trip write: it proves the journal's rule still holds, or writes nothing -----


def read_step(journal: DbJournal, path: str) -> Any:
    record_model_step(journal)
    return run_async(
        journal.record_call(
            name="read",
            request={"arguments": {"path": path}},
            idempotency_key=f"k-{path}-{journal._steps}",
            response={"content": "x"},
        )
    )


def test_a_plain_read_step_is_one_round_trip_and_writes_both_steps_and_their_counts() -> None:
    lease = leased()
    journal = journal_for(lease)
    before = db.round_trips()
    recorded = read_step(journal, "a")
    if db.batches_are_sent_together():
        assert db.round_trips() - before == 1
    steps = list(LoopStep.objects.filter(run_id=lease.run_id).values_list("seq", "kind", "status"))
    assert steps == [(recorded.seq - 1, "model", "completed"), (recorded.seq, "tool", "completed")]
    assert LoopRun.objects.get(pk=lease.run_id).step_count == recorded.seq
    used = UsageBucket.objects.get(scope=f"run:{lease.run_id}", metric="toolCalls").value
    assert used == 1


def test_a_daily_limit_added_after_the_journal_read_the_run_judges_the_next_write() -> None:
    lease = leased()
    journal = journal_for(lease)
    read_step(journal, "a")  # the journal's rule: nothing limits tool calls
    run = LoopRun.objects.get(pk=lease.run_id)
    LoopPattern.objects.filter(pk=run.pattern_id).update(
        policy={"budgets": {"daily": {"toolCalls": 1}}}
    )
    steps = LoopStep.objects.filter(run_id=lease.run_id).count()
    with pytest.raises(BudgetExhausted):
        read_step(journal, "b")
    # The refused call persisted nothing (its model step is kept, as the exact path does).
    assert not LoopStep.objects.filter(run_id=lease.run_id, kind="tool", seq__gt=steps).exists()


def test_a_raised_run_limit_after_the_journal_read_the_run_is_seen_by_the_next_write() -> None:
    lease = leased()
    journal = journal_for(lease)
    read_step(journal, "a")
    LoopRun.objects.filter(pk=lease.run_id).update(
        policy_snapshot=PatternPolicy.model_validate(
            {"budgets": {"perRun": {"toolCalls": 1}}}
        ).model_dump()
    )
    with pytest.raises(BudgetExhausted):
        read_step(journal, "b")


def test_a_call_the_tool_loop_policy_warns_about_is_judged_though_the_rule_said_plain() -> None:
    lease = leased({"toolLoop": {"warnAt": 3, "blockAt": 4, "escalateAt": 5}})
    journal = journal_for(lease)
    read_step(journal, "same")
    read_step(journal, "same")
    # The journal would begin a third identical read before running it; written as if it
    # had run first, with the rule that said plain, the database's count still decides.
    recorded = read_step(journal, "same")
    assert recorded.completed is False  # begun by the exact path, to carry the warning
    assert journal.tool_notice(recorded.seq)


def test_a_lost_lease_writes_nothing_in_the_one_round_trip_path() -> None:
    lease = leased()
    journal = journal_for(lease)
    read_step(journal, "a")
    count = LoopStep.objects.filter(run_id=lease.run_id).count()
    LoopRun.objects.filter(pk=lease.run_id).update(lease_token=lease.token + 1)
    with pytest.raises(LeaseLost):
        read_step(journal, "b")
    assert LoopStep.objects.filter(run_id=lease.run_id).count() == count


# --- the model call's admission: due a second after the run's limits were last read ---------


def admission_queries(journal: DbJournal) -> int:
    """The statements the journal's admission of a model call sent (0: it did not ask)."""
    with CaptureQueriesContext(connections[DEFAULT_DB_ALIAS]) as queries:
        run_async(journal.admit_model_call())
    return len(queries)


@pytest.fixture
def short_recheck(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(budget_rules, "ADMISSION_RECHECK_SECONDS", 0.2)
    return 0.3


def test_an_unmetered_journal_asks_again_once_its_limits_are_a_recheck_old(
    short_recheck: float,
) -> None:
    journal = journal_for(leased())
    assert admission_queries(journal) == 0  # its start read the limits
    time.sleep(short_recheck)
    assert admission_queries(journal) > 0


def test_a_write_that_proved_the_limits_unchanged_is_as_fresh_as_an_admission(
    short_recheck: float,
) -> None:
    journal = journal_for(leased())
    time.sleep(short_recheck)
    read_step(journal, "a")  # its fence proved the run's limits unchanged
    assert admission_queries(journal) == 0


def test_a_daily_tokens_limit_added_meanwhile_is_asked_about_after_the_next_write(
    short_recheck: float,
) -> None:
    lease = leased()
    journal = journal_for(lease)
    run = LoopRun.objects.get(pk=lease.run_id)
    LoopPattern.objects.filter(pk=run.pattern_id).update(
        policy={"budgets": {"daily": {"tokens": 10_000}}}
    )
    read_step(journal, "a")  # the write read the new limits: the run is metered now
    assert admission_queries(journal) > 0

"""What a resume reads back: the invocation's steps, as the ORM would give them, read while the
invocation's start is counted when the run is resuming."""

from __future__ import annotations

from typing import Any

import pytest

from loops.models import LoopRun, LoopStep
from loops.services.steps import steps_of_invocation
from runtime.invocation import LoopRole, StepRecord
from tests.loops.test_journal_numbering import InlineDriver, leased, run_async
from tests.support.factories import make_run

pytestmark = pytest.mark.django_db(transaction=True)


def _step(run: Any, seq: int, invocation: str, **fields: Any) -> LoopStep:
    defaults: dict[str, Any] = {
        "role": "maker",
        "kind": "tool",
        "status": "completed",
        "name": "read",
        "idempotency_key": f"k{seq}",
        "lease_token": 1,
    }
    return LoopStep.objects.create(
        run=run, seq=seq, invocation=invocation, **{**defaults, **fields}
    )


def test_the_steps_are_those_of_the_invocation_in_order_with_their_json_decoded() -> None:
    run = make_run()
    nested = {"path": "a/ü.txt", "n": 2**70, "x": 1.5, "ok": True, "list": [None, {"k": []}]}
    _step(run, 3, "maker:0", request=nested, response={"result": "three"})
    _step(run, 1, "maker:0", kind="model", request={}, response=None, error="")
    _step(run, 2, "leader:0", request={"other": 1}, response="text")
    _step(run, 4, "maker:0", status="failed", request={"q": "x"}, response=[1, "two"], error="no")
    _step(run, 5, "maker:0", request={"q": "y"}, response=None)
    LoopStep.objects.filter(run=run, seq=5).update(response=None)

    records = steps_of_invocation(run.id, "maker:0")

    expected = [
        StepRecord(
            s.seq, s.kind, s.status, s.name, s.idempotency_key, s.request, s.response, s.error
        )
        for s in LoopStep.objects.filter(run=run, invocation="maker:0").order_by("seq")
    ]
    assert records == expected
    assert [r.seq for r in records] == [1, 3, 4, 5]
    assert records[1].request["n"] == 2**70  # exact, not a float
    assert records[0].response is None and records[2].response == [1, "two"]


class CountingDriver(InlineDriver):
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def db(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(fn.__name__)
        return await super().db(fn, *args, **kwargs)


def test_a_resuming_journal_answers_its_steps_from_the_early_read() -> None:
    from loops.worker.engine import DbJournal

    lease = leased()
    run = LoopRun.objects.get(pk=lease.run_id)
    _step(run, 1, "maker:0", request={"q": 1}, response={"result": "r"})
    driver = CountingDriver()

    async def resumed() -> list[StepRecord]:
        journal = DbJournal(driver, lease, LoopRole.MAKER, "maker:0")  # type: ignore[arg-type]
        journal.read_steps_early()
        journal.started(fresh=False, metered=False, steps=1)
        return await journal.steps()

    records = run_async(resumed())
    assert [r.seq for r in records] == [1]
    assert driver.calls == ["resume_point_of"], "the steps were read once, early"


def test_a_fresh_invocation_has_no_steps_whatever_the_early_read_found() -> None:
    from loops.worker.engine import DbJournal

    lease = leased()
    driver = CountingDriver()

    async def fresh() -> list[StepRecord]:
        journal = DbJournal(driver, lease, LoopRole.MAKER, "maker:0")  # type: ignore[arg-type]
        journal.read_steps_early()
        journal.started(fresh=True, metered=False, steps=0)
        steps = await journal.steps()
        journal.forget_early_steps()
        return steps

    assert run_async(fresh()) == []


def test_a_run_claimed_again_comes_with_the_steps_of_the_invocation_it_resumes() -> None:
    from loops.services.claims import run_claim
    from loops.services.runs import runs_release_owner
    from loops.worker.engine import with_resume_steps

    run = make_run()
    [first] = run_claim(owner="resume-a", lease_seconds=300, run_id=run.id)
    assert with_resume_steps(first).resume_steps is None, "a first claim resumes nothing"
    _step(run, 1, "leader", kind="model", request={"step": 1}, response={"message": {}})
    _step(run, 2, "leader", request={"model_seq": 1, "index": 0}, response={"content": "x"})
    _step(run, 3, "maker:0", request={}, response=None)
    assert runs_release_owner(owner="resume-a") == 1

    [again] = run_claim(owner="resume-b", lease_seconds=300, run_id=run.id)
    claimed = with_resume_steps(again)
    if again.columns is None:  # SQLite: the claim did not start the run (no columns read)
        assert claimed.resume_steps is None
        return
    assert claimed.resume_steps == ("leader", (None, steps_of_invocation(run.id, "leader")))
    assert [r.seq for r in claimed.resume_steps[1][1]] == [1, 2]


def test_steps_read_with_the_claim_are_the_journals_without_another_read() -> None:
    from loops.worker.engine import DbJournal

    lease = leased()
    run = LoopRun.objects.get(pk=lease.run_id)
    _step(run, 1, "maker:0", request={"q": 1}, response={"result": "r"})
    records = steps_of_invocation(run.id, "maker:0")
    driver = CountingDriver()

    async def resumed() -> list[StepRecord]:
        journal = DbJournal(driver, lease, LoopRole.MAKER, "maker:0")  # type: ignore[arg-type]
        journal.steps_read((None, records))
        journal.started(fresh=False, metered=False, steps=1)
        return await journal.steps()

    assert run_async(resumed()) == records
    assert driver.calls == []


def test_a_claim_whose_steps_cannot_be_read_still_reaches_the_driver() -> None:
    """The claim has committed when its steps are read: a failure there (here, a run whose
    bindings name no leader) leaves the steps to the invocation and keeps the claim."""
    from dataclasses import replace

    from loops.services.claims import run_claim
    from loops.services.runs import runs_release_owner
    from loops.worker.engine import with_resume_steps

    run = make_run()
    run_claim(owner="resume-c", lease_seconds=300, run_id=run.id)
    runs_release_owner(owner="resume-c")
    [again] = run_claim(owner="resume-d", lease_seconds=300, run_id=run.id)
    if again.columns is None:
        pytest.skip("PostgreSQL's one-statement claim returns the run's columns")
    broken = replace(again, columns={**again.columns, "role_bindings": {}})
    assert with_resume_steps(broken) == broken


def test_a_checkpoint_is_kept_by_the_lease_holder_only_and_read_with_the_steps_after_it() -> None:
    from dataclasses import replace

    from loops.services.checkpoints import checkpoint_keep, resume_point_of

    lease = leased()
    run = LoopRun.objects.get(pk=lease.run_id)
    for seq in (1, 2, 3, 4):
        _step(run, seq, "maker:0", request={"q": seq}, response={"result": seq})
    _step(run, 5, "leader", request={}, response=None)
    assert resume_point_of(run.id, "maker:0") == (None, steps_of_invocation(run.id, "maker:0"))

    stale = replace(lease, token=lease.token + 1)
    assert not checkpoint_keep(stale, "maker:0", 2, '{"v": 1}'), "a lost lease keeps nothing"
    assert resume_point_of(run.id, "maker:0")[0] is None
    assert checkpoint_keep(lease, "maker:0", 2, '{"v": 1, "a": "\\u0000"}')
    assert checkpoint_keep(lease, "maker:0", 3, '{"v": 1, "b": 2}'), "the latest replaces it"
    state, later = resume_point_of(run.id, "maker:0")
    assert state == '{"v": 1, "b": 2}'
    assert [r.seq for r in later] == [4]
    assert resume_point_of(run.id, "leader") == (None, steps_of_invocation(run.id, "leader"))


def test_the_checkpoints_of_ended_runs_are_dropped_and_a_parked_runs_kept() -> None:
    from loops.models import ConversationCheckpoint, RunStatus
    from loops.services.checkpoints import checkpoint_keep, checkpoints_prune

    parked, ended = leased(), leased()
    for lease in (parked, ended):
        assert checkpoint_keep(lease, "maker:0", 1, '{"v": 1}')
    LoopRun.objects.filter(pk=ended.run_id).update(status=RunStatus.SUCCEEDED)
    assert checkpoints_prune(batch=1) == 1
    assert list(ConversationCheckpoint.objects.values_list("run_id", flat=True)) == [parked.run_id]
    assert checkpoints_prune() == 0

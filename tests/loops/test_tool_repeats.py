"""Run-level tool-loop detection: thresholds (pure), counting identical calls in the journal
(fenced services), the runtime honouring a refused call and a notice, and the real engine
warning, blocking and escalating across invocations and resumes (in process)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from loops.models import LoopEvent, LoopStep, RunStatus
from loops.policy import ToolLoopPolicy
from loops.services import budgets
from loops.services.budget_rules import run_scope
from loops.services.runs import run_act
from loops.services.steps import step_record, tool_step_begin
from loops.services.tool_repeats import RepeatVerdict, call_hash, judge
from loops.services.transitions import Lease
from runtime.invocation import ToolCallRefused, ToolLoopEscalated
from tests.support.factories import make_pattern
from tests.support.fake_model import RecordingTool, ScriptedModel, call, calls, invoke, make_invoker
from tests.support.fake_model import text as answer
from tests.support.journal import MemoryJournal
from tests.support.limits import InlineEngine, LoopingModel, queued_run, running_run, tool_request
from tests.support.write_paths import both_write_paths

LOOP = {"toolLoop": {"warnAt": 2, "blockAt": 3, "escalateAt": 5}}


# --- pure ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("occurrence", "verdict"),
    [(1, "ok"), (4, "ok"), (5, "warn"), (7, "warn"), (8, "block"), (11, "block"), (12, "escalate")],
)
def test_the_default_thresholds_warn_at_5_block_at_8_and_escalate_at_12(
    occurrence: int, verdict: str
) -> None:
    assert judge(occurrence, ToolLoopPolicy()) == verdict


def test_the_higher_threshold_wins_when_two_are_equal() -> None:
    policy = ToolLoopPolicy(warnAt=3, blockAt=3, escalateAt=3)
    assert [judge(n, policy) for n in (2, 3)] == [RepeatVerdict.OK, RepeatVerdict.ESCALATE]


def test_identical_calls_hash_alike_whatever_the_key_order() -> None:
    assert call_hash("read", {"a": 1, "b": [1, 2]}) == call_hash("read", {"b": [1, 2], "a": 1})
    assert call_hash("read", {"a": 1}) != call_hash("read", {"a": 2})
    assert call_hash("read", {"a": 1}) != call_hash("list", {"a": 1})
    assert call_hash("read", '{"a": 1') == call_hash("read", '{"a": 1')  # unparsable: as sent


# --- counting in the journal ----------------------------------------------------------------


def begin(lease: Lease, invocation: str = "maker:0", path: str = "same", **kw: Any) -> Any:
    return tool_step_begin(
        lease,
        role="maker",
        invocation=invocation,
        name="read",
        request=tool_request({"path": path}),
        **kw,
    )


def answered(lease: Lease, path: str = "same") -> int:
    """A call the runtime answered without running it (a duplicate, say)."""
    return step_record(
        lease,
        role="maker",
        invocation="maker:0",
        kind="tool",
        name="read",
        request=tool_request({"path": path}),
        response={"content": "Not executed: duplicate", "disposition": "duplicate"},
    )


@both_write_paths
def test_identical_calls_are_counted_across_invocations_and_warned_then_blocked() -> None:
    run, lease = running_run(policy=LOOP)
    assert begin(lease, "leader").notice == ""
    warned = begin(lease, "maker:0")
    assert "'read' has now been called 2 times in this run" in warned.notice
    assert begin(lease, "maker:0", path="other").notice == ""  # other arguments: another call
    blocked = begin(lease, "maker:1")
    assert blocked.refused.startswith("Error: blocked by the run's tool-loop policy")
    step = LoopStep.objects.get(run=run, seq=blocked.seq)
    assert (step.status, step.error) == ("failed", blocked.refused)
    assert step.response == {"content": blocked.refused, "disposition": "blocked"}
    assert budgets.usage(run_scope(run.id), ["toolCalls"])["toolCalls"] == 3  # not the blocked
    events = LoopEvent.objects.filter(run=run, type__startswith="toolloop.").order_by("seq")
    assert [(e.type, e.data["count"]) for e in events] == [
        ("toolloop.warning", 2),
        ("toolloop.blocked", 3),
    ]


@both_write_paths
def test_the_escalating_call_stops_the_run_and_leaves_no_step() -> None:
    run, lease = running_run(policy=LOOP)
    for _ in range(4):
        begin(lease)
    steps = LoopStep.objects.filter(run=run).count()
    with pytest.raises(ToolLoopEscalated) as stopped:
        begin(lease, status="gated")
    assert stopped.value.code == "tool_loop"
    assert stopped.value.data == {"tool": "read", "count": 5, "escalateAt": 5}
    assert "'read' 5 times with exactly the same arguments" in stopped.value.reason
    assert LoopStep.objects.filter(run=run).count() == steps


@both_write_paths
def test_calls_answered_without_running_count_and_can_escalate() -> None:
    run, lease = running_run(policy=LOOP)
    begin(lease)
    answered(lease)
    answered(lease)  # the 3rd: a warning (there is nothing to block)
    answered(lease)
    with pytest.raises(ToolLoopEscalated):
        answered(lease)
    assert LoopStep.objects.filter(run=run, call_hash__isnull=False).count() == 4
    assert LoopEvent.objects.filter(run=run, type="toolloop.warning").count() == 3


# --- the runtime honours the journal ------------------------------------------------------


class RefusingJournal(MemoryJournal):
    """Refuses every call of one tool, and adds a notice to every call of another."""

    def __init__(self, refuse: str, notice: str) -> None:
        super().__init__()
        self.refuse, self.notice = refuse, notice
        self.noticed: set[int] = set()

    async def begin(
        self, *, kind: str, name: str, request: dict[str, Any], idempotency_key: str = ""
    ) -> int:
        if name == self.refuse:
            seq = await self.record(
                kind=kind, name=name, request=request, response={"content": "Error: nope"}
            )
            raise ToolCallRefused("Error: nope", seq=seq)
        seq = await super().begin(
            kind=kind, name=name, request=request, idempotency_key=idempotency_key
        )
        if name == self.notice:
            self.noticed.add(seq)
        return seq

    def tool_notice(self, seq: int) -> str:
        return "[run notice: careful]" if seq in self.noticed else ""


def test_a_refused_call_is_not_run_and_the_model_gets_the_refusal() -> None:
    blocked, fine = RecordingTool("blocked", result="ran"), RecordingTool("fine", result="ran")
    model = ScriptedModel(calls(call("blocked", {}), call("fine", {})), answer("done"))
    journal = RefusingJournal(refuse="blocked", notice="fine")
    outcome, journal = invoke(make_invoker(model, [blocked, fine]), journal)
    assert outcome.kind == "completed"
    assert blocked.calls == [] and len(fine.calls) == 1
    tool_messages = [m["content"] for m in model.requests[1].messages if m["role"] == "tool"]
    assert tool_messages == ["Error: nope", "ran\n\n[run notice: careful]"]
    assert journal.admissions == 2  # every model call asked first


# --- the real engine, in process ------------------------------------------------------------


def peek_twice(messages: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]] | None:
    """Each maker reads the same thing in its first two steps, then answers."""
    made = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
    return [("peek", {"path": "same"})] if made < 2 else None


def tool_results(engine: InlineEngine) -> list[str]:
    last = engine.model.requests[-1].messages
    return [str(m["content"]) for m in last if m["role"] == "tool"]


@pytest.mark.django_db
def test_the_engine_warns_blocks_and_escalates_identical_calls_across_makers() -> None:
    engine = InlineEngine(model=LoopingModel(maker_turn=peek_twice))
    pattern = make_pattern(maker_usernames=["m0", "m1", "m2"], policy=LOOP)
    run = queued_run(pattern)
    assert engine.drive(run.id) == RunStatus.WAITING_HUMAN
    run.refresh_from_db()
    assert run.terminal_reason == "tool_loop"
    assert "'peek' 5 times with exactly the same arguments" in run.failure_reason
    assert len(engine.peek.calls) == 2  # maker 0 ran it twice; maker 1 was refused twice
    makers = [r for r in engine.model.requests if "maker" in str(r.messages[0]["content"])]
    seen = [str(m["content"]) for r in makers for m in r.messages if m["role"] == "tool"]
    assert any("[run notice: 'peek' has now been called 2 times" in s for s in seen)
    assert sum("blocked by the run's tool-loop policy" in s for s in set(seen)) == 2
    escalated = LoopEvent.objects.get(run=run, type="toolloop.escalated")
    assert (escalated.to_status, escalated.data["count"]) == ("waiting_human", 5)
    assert LoopEvent.objects.filter(run=run, type="toolloop.blocked").count() == 2
    assert run.cursor["maker_index"] == 2  # it stopped in the third maker


@pytest.mark.django_db
def test_the_count_survives_a_park_and_a_resume() -> None:
    """A budget stops the run between the first and the second identical call; after the
    raise and resume, a fresh journal counts on from the steps: the second call is warned."""
    engine = InlineEngine(model=LoopingModel(maker_turn=peek_twice))
    policy = {**LOOP, "budgets": {"perRun": {"toolCalls": 1}}}
    run = queued_run(make_pattern(policy=policy))
    assert engine.drive(run.id) == RunStatus.BLOCKED
    assert not LoopEvent.objects.filter(run=run, type="toolloop.warning").exists()
    budgets.run_budget_raise(run_id=run.id, per_run={"toolCalls": 10}, actor="op")
    run_act(run_id=run.id, action="resume", actor="op")
    assert engine.drive(run.id) == RunStatus.SUCCEEDED
    warning = LoopEvent.objects.get(run=run, type="toolloop.warning")
    assert warning.data["count"] == 2
    assert len(engine.peek.calls) == 2

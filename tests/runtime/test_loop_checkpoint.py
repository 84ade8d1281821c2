"""A parked invocation keeps a conversation checkpoint; its resume reads only the steps after
it and continues exactly as a replay of the whole journal would (runtime/checkpoint.py)."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from runtime.checkpoint import MIN_ENTRIES, checkpoint_of, from_json
from runtime.invocation import OutcomeKind
from runtime.repetition import RepetitionLimits
from runtime.types import Effect
from tests.support.fake_model import (
    RecordingTool,
    ScriptedModel,
    calls,
    invoke,
    make_invoker,
    text,
)
from tests.support.journal import MemoryJournal

PLAN = {"read": "allow", "peek": "allow", "write": ("ask", "writes need a human")}
HISTORY = MIN_ENTRIES + 9
STEPS = HISTORY + 6


def _tools() -> list[RecordingTool]:
    return [
        RecordingTool("read", result="read ok"),
        RecordingTool("peek", result="peeked"),
        RecordingTool("write", Effect.WRITE),
    ]


def _history_then_write() -> ScriptedModel:
    """``HISTORY`` steps alternating two read tools (each ``read`` path twice: the repetition
    counts carry over), then a gated write."""
    reads = [
        calls(("read", {"path": f"f{i // 4}"}) if i % 2 == 0 else ("peek", {"path": f"p{i}"}))
        for i in range(HISTORY)
    ]
    return ScriptedModel(*reads, calls(("write", {"path": "out.txt"})))


def _parked(**settings: Any) -> tuple[MemoryJournal, int]:
    invoker = make_invoker(_history_then_write(), _tools(), PLAN, max_steps=STEPS, **settings)
    outcome, journal = invoke(invoker)
    assert outcome.kind is OutcomeKind.NEEDS_APPROVAL
    [gated] = outcome.output["gated"]
    return journal, gated["seq"]


def _resume(journal: MemoryJournal, **settings: Any) -> tuple[Any, ScriptedModel, RecordingTool]:
    tools = _tools()
    model = ScriptedModel(text("done"))
    invoker = make_invoker(model, tools, PLAN, max_steps=STEPS, **settings)
    outcome, _ = invoke(invoker, journal)
    return outcome, model, tools[2]


def _without_checkpoint(journal: MemoryJournal) -> MemoryJournal:
    copied = copy.deepcopy(journal)
    copied.checkpoint = None
    return copied


def test_a_parked_invocation_keeps_the_fold_of_every_step_before_its_last() -> None:
    journal, gated_seq = _parked()
    assert journal.checkpoint is not None
    upto, state = journal.checkpoint
    last_model = max(s.seq for s in journal.rows if s.kind == "model")
    assert upto == last_model - 1 and gated_seq > last_model
    checkpoint = from_json(state)
    assert checkpoint is not None
    assert checkpoint.model_steps == HISTORY
    # One assistant message and one tool result per read step, after the prompt.
    assert len(checkpoint.history) == 2 * HISTORY
    assert checkpoint.prompt[0]["role"] == "system"
    _, later = asyncio.run(journal.resume_point())
    assert [s.seq for s in later] == [s.seq for s in journal.rows if s.seq > upto]


def test_the_resume_from_the_checkpoint_asks_the_model_what_a_full_replay_asks() -> None:
    journal, gated_seq = _parked()
    replayed = _without_checkpoint(journal)
    for copy_ in (journal, replayed):
        copy_.approve(gated_seq)
    outcome, model, write = _resume(journal)
    full_outcome, full_model, full_write = _resume(replayed)
    assert outcome == full_outcome and outcome.kind is OutcomeKind.COMPLETED
    assert write.finished == full_write.finished == [{"path": "out.txt"}]
    [request], [full_request] = model.requests, full_model.requests
    assert json.dumps(request.messages) == json.dumps(full_request.messages)
    checkpoint = from_json(journal.checkpoint[1]) if journal.checkpoint else None
    assert checkpoint is not None  # prompt, history, the write and its result
    assert len(request.messages) == len(checkpoint.prompt) + 2 * HISTORY + 2


def test_a_checkpoint_folded_under_other_repetition_limits_is_not_used() -> None:
    journal, gated_seq = _parked()
    journal.approve(gated_seq)
    stricter = RepetitionLimits(duplicate_skip_at=4)
    checkpoint = from_json(journal.checkpoint[1]) if journal.checkpoint else None
    assert checkpoint is not None
    _, later = asyncio.run(journal.resume_point())
    assert not checkpoint.fits(later, stricter, _Endpoint())
    replayed = _without_checkpoint(journal)
    outcome, model, _ = _resume(journal, repetition=stricter)
    full_outcome, full_model, _ = _resume(replayed, repetition=stricter)
    assert outcome == full_outcome
    assert json.dumps(model.requests[0].messages) == json.dumps(full_model.requests[0].messages)


def test_a_short_invocation_keeps_no_checkpoint_and_a_torn_one_is_ignored() -> None:
    model = ScriptedModel(calls(("read", {"path": "a"})), calls(("write", {"path": "b"})))
    outcome, journal = invoke(make_invoker(model, _tools(), PLAN))
    assert outcome.kind is OutcomeKind.NEEDS_APPROVAL
    assert journal.checkpoint is None
    assert from_json("{not json") is None
    assert from_json(json.dumps({"v": 99})) is None


def test_no_checkpoint_when_a_tool_step_after_it_answers_a_call_it_covers() -> None:
    journal, _ = _parked()
    steps = asyncio.run(journal.steps())
    limits, endpoint = RepetitionLimits(), _Endpoint()
    found = checkpoint_of(steps, journal.idempotency_key, limits=limits, endpoint=endpoint)
    assert found is not None
    # A late result for a covered call (as a torn journal could hold): the split is not clean.
    first_tool = next(s for s in steps if s.kind == "tool")
    late = copy.deepcopy(first_tool)
    object.__setattr__(late, "seq", steps[-1].seq + 1)
    assert (
        checkpoint_of([*steps, late], journal.idempotency_key, limits=limits, endpoint=endpoint)
        is None
    )
    assert not found.fits([late], limits, endpoint)


class _Endpoint:
    vision = False
    endpoint_name = "test"

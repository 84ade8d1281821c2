"""Read-effect calls the journal lets run first: the call runs, then its step is written once,
finished, with its result (``record_call``). A call that changes nothing needs no durable
start: after a crash it simply runs again. Calls with an effect are still begun first."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.invocation import RecordedCall, ToolCallRefused
from runtime.types import Effect
from tests.support.fake_model import (
    RecordingTool,
    ScriptedModel,
    calls,
    invoke,
    last_tool_messages,
    make_invoker,
    make_request,
    text,
)
from tests.support.journal import MemoryJournal, SimulatedCrash


def reads_first() -> MemoryJournal:
    return MemoryJournal(reads_run_first=True)


def test_a_read_runs_first_and_is_written_once_finished_with_its_result() -> None:
    read = RecordingTool("read", result="contents")
    model = ScriptedModel(calls(("read", {"path": "a"})), text("Done."))
    outcome, journal = invoke(make_invoker(model, [read]), reads_first())
    assert outcome.output == {"text": "Done."}
    assert [(op, kind) for op, kind, _ in journal.writes] == [
        ("record", "model"),
        ("record_call", "tool"),
        ("record", "model"),
    ]
    [step] = journal.of_kind("tool")
    assert (step.status, step.response) == ("completed", {"content": "contents"})
    assert step.idempotency_key == journal.idempotency_key(1, 0)
    assert last_tool_messages(model.requests[1]) == ["contents"]


def test_a_call_with_an_effect_is_still_begun_before_it_runs() -> None:
    write = RecordingTool("write", Effect.WRITE)
    model = ScriptedModel(calls(("write", {"path": "a"})), text("Done."))
    _, journal = invoke(make_invoker(model, [write]), reads_first())
    assert [(op, kind) for op, kind, _ in journal.writes][1:3] == [
        ("begin", "tool"),
        ("complete", "tool"),
    ]


def test_a_read_whose_result_was_lost_in_a_crash_runs_again_on_resume() -> None:
    read = RecordingTool("read", result="contents")
    journal = reads_first()
    journal.crash_instead_of_next("record_call", "tool")  # it ran; the worker died before
    with pytest.raises(SimulatedCrash):
        invoke(make_invoker(ScriptedModel(calls(("read", {"path": "a"}))), [read]), journal)
    assert len(read.finished) == 1 and journal.of_kind("tool") == []

    model = ScriptedModel(text("Done."))
    outcome, _ = invoke(make_invoker(model, [read]), journal)
    assert outcome.output == {"text": "Done."}
    assert len(read.finished) == 2  # nothing recorded it, so it ran again: it changes nothing
    assert len(journal.of_kind("tool")) == 1
    assert last_tool_messages(model.requests[0]) == ["contents"]


class RefusingAtRecord(MemoryJournal):
    """Refuses a read when it is written (the run's limits changed since the last write)."""

    async def record_call(self, **kwargs: Any) -> RecordedCall:
        seq = self._add("record_call", "tool", "failed", kwargs["name"], kwargs["request"], "")
        self.step(seq).response = {"content": "Error: refused", "disposition": "blocked"}
        raise ToolCallRefused("Error: refused", seq=seq)


def test_a_read_refused_when_it_is_written_gives_the_model_the_refusal_not_its_result() -> None:
    read = RecordingTool("read", result="secret contents")
    model = ScriptedModel(calls(("read", {"path": "a"})), text("Done."))
    outcome, _ = invoke(
        make_invoker(model, [read]), RefusingAtRecord(reads_run_first=True), make_request()
    )
    assert outcome.output == {"text": "Done."}
    assert last_tool_messages(model.requests[1]) == ["Error: refused"]


class BeginsAtRecord(MemoryJournal):
    """Begins the read instead of finishing it (a notice must go with its result)."""

    async def record_call(self, **kwargs: Any) -> RecordedCall:
        seq = self._add("begin", "tool", "started", kwargs["name"], kwargs["request"], "")
        return RecordedCall(seq, completed=False)

    def tool_notice(self, seq: int) -> str:
        return "[run notice: careful]"


def test_a_read_the_journal_only_began_is_completed_with_the_runs_notice() -> None:
    read = RecordingTool("read", result="contents")
    model = ScriptedModel(calls(("read", {"path": "a"})), text("Done."))
    _, journal = invoke(make_invoker(model, [read]), BeginsAtRecord(reads_run_first=True))
    [step] = journal.of_kind("tool")
    assert step.status == "completed"
    assert step.response == {"content": "contents\n\n[run notice: careful]"}
    assert last_tool_messages(model.requests[1]) == ["contents\n\n[run notice: careful]"]

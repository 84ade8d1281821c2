"""Durability: a crash at any point is continued from the journal. A finished tool call is
never re-run; a started one is re-issued with the same idempotency key; counters survive."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from runtime.invocation import OutcomeKind
from runtime.loop import ToolLoopInvoker
from runtime.policy import ToolPolicy
from runtime.tools import DirectoryLedger, FileToolConfig, builtin_registry
from runtime.types import Effect
from tests.support.fake_model import (
    RecordingTool,
    ScriptedModel,
    calls,
    factory,
    invoke,
    last_tool_messages,
    make_invoker,
    make_request,
    text,
)
from tests.support.journal import MemoryJournal, SimulatedCrash


def crash(invoker: ToolLoopInvoker, journal: MemoryJournal, **request: object) -> None:
    with pytest.raises(SimulatedCrash):
        invoke(invoker, journal, make_request(**request) if request else None)


def file_tools_invoker(model: ScriptedModel, config: FileToolConfig) -> ToolLoopInvoker:
    """The builtin file tools, all allowed."""
    return ToolLoopInvoker(
        model_clients=factory(model),
        tools=builtin_registry(config),
        policy=lambda request: ToolPolicy.from_decisions(
            {name: "allow" for name in ("read", "list", "write", "edit")}
        ),
    )


def test_a_crash_between_a_tool_result_and_the_next_model_step_does_not_rerun_the_tool() -> None:
    read = RecordingTool("read", result="first result")
    journal = MemoryJournal()
    journal.crash_after_next("complete", "tool")
    crash(make_invoker(ScriptedModel(calls(("read", {"path": "a"}))), [read]), journal)
    assert len(read.finished) == 1

    model = ScriptedModel(text("Done."))
    outcome, _ = invoke(make_invoker(model, [read]), journal)
    assert outcome.output == {"text": "Done."}
    assert len(read.calls) == 1  # not run again
    assert last_tool_messages(model.requests[0]) == ["first result"]


def test_a_crash_after_the_model_step_runs_its_tools_without_asking_the_model_again() -> None:
    read = RecordingTool("read")
    journal = MemoryJournal()
    journal.crash_after_next("record", "model")
    crash(
        make_invoker(ScriptedModel(calls(("read", {"n": 1}), ("read", {"n": 2}))), [read]), journal
    )
    assert read.calls == []

    model = ScriptedModel(text("Done."))
    outcome, _ = invoke(make_invoker(model, [read]), journal)
    assert outcome.output == {"text": "Done."}
    assert read.finished == [{"n": 1}, {"n": 2}]
    assert len(model.requests) == 1


def test_a_started_write_is_reissued_with_the_same_idempotency_key() -> None:
    write = RecordingTool("write", Effect.WRITE)
    journal = MemoryJournal()
    journal.crash_after_next("begin", "tool")  # persisted as started, then the worker died
    crash(make_invoker(ScriptedModel(calls(("write", {"path": "a"}))), [write]), journal)
    [started] = journal.of_kind("tool")
    assert started.status == "started"

    outcome, _ = invoke(make_invoker(ScriptedModel(text("Done.")), [write]), journal)
    assert outcome.kind is OutcomeKind.COMPLETED
    assert write.keys == [started.idempotency_key] == [journal.idempotency_key(1, 0)]
    [(_, context)] = write.calls
    assert context.reissued
    assert journal.step(started.seq).status == "completed"  # completed in place
    assert len(journal.of_kind("tool")) == 1


def test_only_the_missing_calls_of_the_last_step_are_carried_out() -> None:
    work = RecordingTool("work", Effect.WRITE, result=lambda args: f"r{args['n']}")
    journal = MemoryJournal()
    journal.crash_after_next("begin", "tool", count=2)  # call 0 done, call 1 started, 2 missing
    model = ScriptedModel(calls(*[("work", {"n": n}) for n in range(3)]))
    crash(make_invoker(model, [work], tool_concurrency=1), journal)
    assert [a for a, _ in work.calls] == [{"n": 0}]

    model = ScriptedModel(text("Done."))
    invoke(make_invoker(model, [work], tool_concurrency=1), journal)
    assert [a for a, _ in work.calls] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert [c.reissued for _, c in work.calls] == [False, True, False]
    assert work.keys == [journal.idempotency_key(1, n) for n in range(3)]
    assert last_tool_messages(model.requests[0]) == ["r0", "r1", "r2"]


def test_an_edit_that_happened_before_the_crash_is_not_applied_twice(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "counter.txt").write_text("count = 1\n")
    ledger = tmp_path / "ledger"
    arguments = {"path": "counter.txt", "old_text": "count = 1", "new_text": "count = 1 + 1"}
    journal = MemoryJournal()
    # The edit ran, but its result never reached the journal.
    journal.crash_instead_of_next("complete", "tool")

    def invoker(model: ScriptedModel) -> ToolLoopInvoker:
        return file_tools_invoker(model, FileToolConfig(ledger=DirectoryLedger(ledger)))

    crash(invoker(ScriptedModel(calls(("edit", arguments)))), journal, workdir=str(workdir))
    assert (workdir / "counter.txt").read_text() == "count = 1 + 1\n"
    [started] = journal.of_kind("tool")
    assert started.status == "started"

    model = ScriptedModel(text("Done."))
    outcome, _ = invoke(invoker(model), journal, make_request(workdir=str(workdir)))
    assert outcome.kind is OutcomeKind.COMPLETED
    assert (workdir / "counter.txt").read_text() == "count = 1 + 1\n"
    assert last_tool_messages(model.requests[0]) == [
        "Replaced 1 occurrence(s) in counter.txt. (already applied)"
    ]


def test_the_step_count_survives_a_resume() -> None:
    read = RecordingTool("read")
    journal = MemoryJournal()
    journal.crash_after_next("complete", "tool", count=2)
    crash(
        make_invoker(
            ScriptedModel(calls(("read", {"n": 1})), calls(("read", {"n": 2}))), [read], max_steps=3
        ),
        journal,
    )
    model = ScriptedModel(text("Summary."))
    invoke(make_invoker(model, [read], max_steps=3), journal)
    # The third step overall is the last normal one: it carries the instruction to stop.
    assert "Stop using tools now" in model.requests[0].messages[-1]["content"]
    assert journal.of_kind("model")[-1].request["phase"] == "last"


def test_repetition_counters_survive_a_resume() -> None:
    read = RecordingTool("read")
    journal = MemoryJournal()
    journal.crash_after_next("complete", "tool", count=2)
    crash(
        make_invoker(
            ScriptedModel(calls(("read", {"p": "a"})), calls(("read", {"p": "a"}))), [read]
        ),
        journal,
    )
    model = ScriptedModel(calls(("read", {"p": "a"})), text("ok"))
    invoke(make_invoker(model, [read]), journal)
    assert len(read.finished) == 2  # the third identical call was skipped
    [message] = last_tool_messages(model.requests[1])
    assert message.startswith("Not executed: this is call number 3")


def test_a_recorded_final_answer_is_returned_without_calling_the_model_again() -> None:
    journal = MemoryJournal()
    journal.crash_after_next("record", "model")
    crash(make_invoker(ScriptedModel(text("The answer.")), []), journal)
    model = ScriptedModel()
    outcome, _ = invoke(make_invoker(model, []), journal)
    assert outcome.output == {"text": "The answer."}
    assert model.requests == []


def test_a_resume_continues_with_the_prompt_the_invocation_started_with() -> None:
    journal = MemoryJournal()
    journal.crash_after_next("complete", "tool")
    read = RecordingTool("read")
    first = ToolLoopInvoker(
        model_clients=factory(ScriptedModel(calls(("read", {})))),
        tools=make_invoker(ScriptedModel(), [read]).tools,
        policy=lambda request: ToolPolicy.from_decisions({"read": "allow"}),
        system_prompt=lambda request: "Prompt v1",
    )
    crash(first, journal)
    model = ScriptedModel(text("ok"))
    second = ToolLoopInvoker(
        model_clients=factory(model),
        tools=first.tools,
        policy=first.policy,
        system_prompt=lambda request: "Prompt v2 (edited meanwhile)",
    )
    invoke(second, journal)
    assert model.requests[0].messages[0]["content"] == "Prompt v1"


def test_max_files_counts_files_written_before_the_crash(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    config = FileToolConfig(max_files=1)

    def invoker(model: ScriptedModel) -> ToolLoopInvoker:
        return file_tools_invoker(model, config)

    journal = MemoryJournal()
    journal.crash_after_next("complete", "tool")
    crash(
        invoker(ScriptedModel(calls(("write", {"path": "a.txt", "content": "a"})))),
        journal,
        workdir=str(workdir),
    )
    model = ScriptedModel(calls(("write", {"path": "b.txt", "content": "b"})), text("ok"))
    invoke(invoker(model), journal, make_request(workdir=str(workdir)))
    [message] = last_tool_messages(model.requests[1])
    assert "at most 1 distinct files and has written a.txt" in message
    assert not (workdir / "b.txt").exists()


def test_a_resume_replays_finished_calls_with_their_recorded_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replay re-plans each settled step from what its results record (the validated
    arguments) instead of validating the model's text again, and reaches the same state: the
    same tool messages, and the repetition guard still counting the earlier calls."""
    read = RecordingTool("read")
    journal = MemoryJournal()
    journal.crash_after_next("complete", "tool", count=2)
    first = ScriptedModel(calls(("read", {"p": "a"})), calls(("read", {"p": "a"})))
    crash(make_invoker(first, [read]), journal)

    from runtime import dispatch

    validated: list[str] = []
    real = dispatch.validate_arguments

    def counting(name: str, raw: str, schema: object) -> object:
        validated.append(raw)
        return real(name, raw, schema)  # type: ignore[arg-type]

    monkeypatch.setattr(dispatch, "validate_arguments", counting)
    model = ScriptedModel(calls(("read", {"p": "a"})), text("ok"))
    invoke(make_invoker(model, [read]), journal)
    assert len(validated) == 1  # only the new step's call; the two replayed ones were not
    assert len(read.finished) == 2  # and the guard still skipped the third identical call
    [message] = last_tool_messages(model.requests[1])
    assert message.startswith("Not executed: this is call number 3")
    assert last_tool_messages(model.requests[0]) == ["ok"]  # the replayed result, as recorded


def test_the_replay_shortcut_reaches_the_conversation_a_full_re_plan_reaches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Earlier steps whose calls all ran are folded without re-planning them; the model must
    then see exactly what a full re-plan of every step gives it (messages, warnings, and the
    repetition guard's verdict on the next call)."""
    from runtime.loop import _Stepper

    def crashed_journal() -> MemoryJournal:
        journal = MemoryJournal()
        journal.crash_after_next("complete", "tool", count=4)
        steps = [calls(("read", {"p": "a"})), calls(("read", {"p": "b"}), ("read", {"p": "c"}))]
        steps += [calls(("read", {"p": "a"})), calls(("read", {"p": "d"}))]
        crash(make_invoker(ScriptedModel(*steps), [RecordingTool("read")]), journal)
        return journal

    def resumed_requests() -> list[object]:
        model = ScriptedModel(calls(("read", {"p": "a"})), text("ok"))
        invoke(make_invoker(model, [RecordingTool("read")]), crashed_journal())
        # Call ids come from a counter of the scripted model: they differ between the runs.
        return [
            json.loads(re.sub(r'"(call_\w+)"', '"id"', json.dumps(r.messages)))
            for r in model.requests
        ]

    taken: list[bool] = []
    shortcut_of = _Stepper._replay_settled

    def spied(self: _Stepper, *args: Any) -> bool:
        taken.append(shortcut_of(self, *args))
        return taken[-1]

    monkeypatch.setattr(_Stepper, "_replay_settled", spied)
    shortcut = resumed_requests()
    assert taken == [True, True]  # the two earlier steps; the last one is planned in full
    monkeypatch.setattr(_Stepper, "_replay_settled", lambda *_: False)
    assert resumed_requests() == shortcut
    # The guard counted the replayed calls: the third identical call is not executed.
    assert shortcut[1][-1]["content"].startswith("Not executed: this is call number 3")

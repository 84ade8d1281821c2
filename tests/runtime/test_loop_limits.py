"""Limits of the loop: bounded concurrency in call order, max steps with the final summary,
the per-tool timeout, output truncation, repetition protection."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtime.invocation import OutcomeKind
from runtime.repetition import (
    Repetition,
    RepetitionLimits,
    RepetitionState,
    observe,
    signature,
)
from runtime.truncation import safe_cut_index, truncate_output
from tests.support.fake_model import (
    RecordingTool,
    ScriptedModel,
    calls,
    invoke,
    last_tool_messages,
    make_invoker,
    text,
)

# --- bounded concurrency -----------------------------------------------------------------------


def slow_tool() -> RecordingTool:
    return RecordingTool(
        "work", result=lambda args: f"result {args['n']}", sleep=lambda args: args["delay"]
    )


def test_calls_of_one_step_run_concurrently_and_results_keep_the_call_order() -> None:
    work = slow_tool()
    delays = [0.30, 0.05, 0.20, 0.10, 0.15, 0.01]
    model = ScriptedModel(
        calls(*[("work", {"n": n, "delay": d}) for n, d in enumerate(delays)]), text("ok")
    )
    _, journal = invoke(make_invoker(model, [work]))
    assert work.max_in_flight == 4  # the default pool
    assert last_tool_messages(model.requests[1]) == [f"result {n}" for n in range(6)]
    finish_order = [
        journal.step(seq).request["index"] for op, kind, seq in journal.writes if op == "complete"
    ]
    assert finish_order != sorted(finish_order)  # they did finish out of order


def test_the_concurrency_limit_is_configurable() -> None:
    work = slow_tool()
    model = ScriptedModel(calls(*[("work", {"n": n, "delay": 0.05}) for n in range(5)]), text("ok"))
    invoke(make_invoker(model, [work], tool_concurrency=2))
    assert work.max_in_flight == 2
    assert len(work.finished) == 5


# --- max steps and the final summary -----------------------------------------------------------


def test_the_last_normal_step_asks_for_a_summary_and_its_tool_calls_are_not_run() -> None:
    read = RecordingTool("read")
    model = ScriptedModel(
        calls(("read", {"n": 1})),
        calls(("read", {"n": 2})),
        calls(("read", {"n": 3}), ("read", {"n": 4})),  # the last normal step: ignored
        text("Completed: read 1 and 2. Incomplete: 3. Next: read 3."),
    )
    outcome, journal = invoke(make_invoker(model, [read], max_steps=3))
    assert outcome.output == {"text": "Completed: read 1 and 2. Incomplete: 3. Next: read 3."}
    assert read.finished == [{"n": 1}, {"n": 2}]
    last, final = model.requests[2], model.requests[3]
    assert [t["function"]["name"] for t in last.tools] == ["read"]  # schemas kept ...
    assert "Stop using tools now" in last.messages[-1]["content"]  # ... but told to stop
    assert "recommended next steps" in last.messages[-1]["content"]
    assert final.tools == []  # the one extra step has no tools at all
    assert "Stop using tools now" in final.messages[-1]["content"]
    not_executed = last_tool_messages(final)
    assert len(not_executed) == 2
    assert all(m.startswith("Not executed: the step limit is reached") for m in not_executed)
    phases = [s.request["phase"] for s in journal.of_kind("model")]
    assert phases == ["normal", "normal", "last", "final"]


def test_a_text_answer_in_the_last_normal_step_ends_the_loop_without_an_extra_step() -> None:
    model = ScriptedModel(calls(("read", {})), text("Summary."))
    outcome, _ = invoke(make_invoker(model, [RecordingTool("read")], max_steps=2))
    assert outcome.output == {"text": "Summary."}
    assert model.remaining == 0
    assert len(model.requests) == 2


def test_tool_calls_in_the_final_step_are_ignored_and_its_text_is_the_answer() -> None:
    read = RecordingTool("read")
    model = ScriptedModel(
        calls(("read", {"n": 1})),
        calls(("read", {"n": 2}), content="Summary so far."),
    )
    outcome, journal = invoke(make_invoker(model, [read], max_steps=1))
    assert outcome.output == {"text": "Summary so far."}
    assert read.calls == []
    final = journal.of_kind("model")[-1]
    assert final.response["ignored_tool_calls"] == ["read"]
    assert "tool_calls" not in final.response["message"]


def test_a_final_step_without_text_fails_the_invocation() -> None:
    model = ScriptedModel(calls(("read", {})), calls(("read", {"n": 2})))
    outcome, _ = invoke(make_invoker(model, [RecordingTool("read")], max_steps=1))
    assert (outcome.kind, outcome.code) == (OutcomeKind.FAILED, "empty_answer")


# --- per-tool timeout --------------------------------------------------------------------------


def test_a_tool_that_runs_too_long_becomes_a_timeout_error_result() -> None:
    slow = RecordingTool("slow", sleep=30)
    model = ScriptedModel(calls(("slow", {})), text("ok"))
    outcome, journal = invoke(make_invoker(model, [slow], tool_timeout_seconds=0.05))
    assert outcome.kind is OutcomeKind.COMPLETED
    [message] = last_tool_messages(model.requests[1])
    assert message.startswith("Error: tool 'slow' timed out after 0.05 s and was abandoned.")
    assert slow.cancelled == 1
    [(_, context)] = slow.calls
    assert context.cancelled.is_set()
    assert journal.of_kind("tool")[0].status == "failed"


def test_the_tool_context_carries_the_deadline() -> None:
    read = RecordingTool("read")
    model = ScriptedModel(calls(("read", {})), text("ok"))
    invoke(make_invoker(model, [read], tool_timeout_seconds=42))
    [(_, context)] = read.calls
    assert 40 < context.remaining() <= 42 or context.remaining() == 0  # time passes in the test


# --- output truncation -------------------------------------------------------------------------


def test_long_tool_output_is_cut_with_a_note_and_never_splits_a_character() -> None:
    output = "é" * 9 + "👍🏽" + "z" * 100
    tool = RecordingTool("big", result=output)
    model = ScriptedModel(calls(("big", {})), text("ok"))
    _, journal = invoke(make_invoker(model, [tool], max_tool_output_chars=10))
    [message] = last_tool_messages(model.requests[1])
    assert message.startswith("é" * 9 + "\n\n[output truncated: showing the first 9 of 111")
    message.encode("utf-8")
    assert journal.of_kind("tool")[0].response["truncated_from"] == 111


def test_truncation_keeps_short_text_as_it_is() -> None:
    kept = truncate_output("short", 50_000)
    assert (kept.text, kept.truncated) == ("short", False)


def test_truncation_moves_the_cut_before_a_combining_mark_zwj_or_flag() -> None:
    assert safe_cut_index("ae\u0301", 2) == 1  # é as e + combining acute
    assert safe_cut_index("a👨\u200d👩", 2) == 1  # inside a ZWJ sequence
    assert safe_cut_index("a👨\u200d👩", 3) == 1
    assert safe_cut_index("a🇫🇷", 2) == 1  # between the two halves of a flag
    assert safe_cut_index("a🇫🇷🇩🇪", 3) == 3  # between two flags is fine
    assert safe_cut_index("abc", 2) == 2


@given(st.text(max_size=60), st.integers(min_value=0, max_value=70))
def test_truncated_text_is_a_prefix_within_the_limit_and_valid_utf8(text_: str, limit: int) -> None:
    cut = safe_cut_index(text_, limit)
    assert 0 <= cut <= min(limit, len(text_))
    result = truncate_output(text_, limit)
    if len(text_) <= limit:
        assert result.text == text_
    else:
        assert result.text.startswith(text_[:cut])
        assert "[output truncated" in result.text
    result.text.encode("utf-8")


# --- repetition protection ---------------------------------------------------------------------

LIMITS = RepetitionLimits()


def verdicts(sequence: list[tuple[str, str]], steps: list[int] | None = None) -> list[Repetition]:
    """Verdicts for calls made one per step (or in the given steps)."""
    state, out = RepetitionState(), []
    for position, (tool, arguments) in enumerate(sequence):
        step = steps[position] if steps else position
        observed = observe(state, tool, arguments, LIMITS, step=step)
        state = observed.state
        out.append(observed.verdict)
    return out


def test_an_identical_call_is_flagged_from_its_third_occurrence() -> None:
    sequence = [("read", "{a}"), ("list", "{}"), ("read", "{a}"), ("list", "{x}"), ("read", "{a}")]
    assert verdicts(sequence)[-1] is Repetition.DUPLICATE
    assert Repetition.DUPLICATE not in verdicts(sequence)[:-1]


def test_identical_calls_within_one_step_count_too() -> None:
    assert verdicts([("read", "{a}")] * 3, steps=[1, 1, 1])[-1] is Repetition.DUPLICATE


def test_one_tool_in_consecutive_steps_warns_at_five_and_finalizes_at_seven() -> None:
    sequence = [("read", f"{{{n}}}") for n in range(7)]
    assert verdicts(sequence) == [Repetition.OK] * 4 + [Repetition.WARN] * 2 + [Repetition.FINALIZE]


def test_parallel_calls_of_one_tool_in_one_step_count_once() -> None:
    sequence = [("read", f"{n}") for n in range(12)]
    steps = [1] * 8 + [2] * 4  # eight files read at once, then four
    assert set(verdicts(sequence, steps)) == {Repetition.OK}


@given(
    st.lists(
        st.tuples(st.sampled_from(["read", "list"]), st.sampled_from(["{a}", "{b}", "{}"])),
        max_size=40,
    )
)
def test_counts_are_a_value_every_earlier_state_keeps(sequence: list[tuple[str, str]]) -> None:
    """The persistent counts equal a recount of the calls up to each state, and counting more
    (or branching from an earlier state) never changes what an earlier state says."""
    states = [RepetitionState()]
    for position, (tool, arguments) in enumerate(sequence):
        states.append(observe(states[-1], tool, arguments, LIMITS, step=position).state)
    branch = observe(states[len(states) // 2], "other", "{}", LIMITS, step=0).state
    for upto, state in enumerate(states):
        recount: dict[str, int] = {}
        for tool, arguments in sequence[:upto]:
            key = signature(tool, arguments)
            recount[key] = recount.get(key, 0) + 1
        assert dict(state.seen) == recount
    assert branch.seen[signature("other", "{}")] == 1
    assert signature("other", "{}") not in states[-1].seen


def test_another_tool_in_between_resets_the_consecutive_count() -> None:
    sequence = (
        [("read", f"{n}") for n in range(4)]
        + [("list", "")]
        + [("read", f"{n}") for n in range(10, 14)]
    )
    assert set(verdicts(sequence)) == {Repetition.OK}


def test_the_loop_skips_the_third_identical_call_and_says_to_reuse_the_result() -> None:
    read = RecordingTool("read", result="content")
    model = ScriptedModel(
        calls(("read", {"path": "a"})),
        calls(("read", {"path": "a"})),
        calls(("read", {"path": "a"})),
        text("ok"),
    )
    _, journal = invoke(make_invoker(model, [read]))
    assert len(read.finished) == 2
    [message] = last_tool_messages(model.requests[3])
    assert message.startswith("Not executed: this is call number 3 of 'read'")
    assert "Reuse the result" in message
    assert "tool.duplicate" in journal.event_types()


def test_one_tool_in_seven_consecutive_steps_warns_then_forces_the_final_step() -> None:
    read = RecordingTool("read", result="content")
    model = ScriptedModel(
        *[calls(("read", {"n": n})) for n in range(7)],
        text("Summary."),
    )
    outcome, journal = invoke(make_invoker(model, [read]))
    assert outcome.output == {"text": "Summary."}
    assert [a["n"] for a in read.finished] == list(range(6))
    for step in (4, 5):  # the 5th and 6th steps' calls ran, with a warning appended
        [message] = last_tool_messages(model.requests[step + 1])
        assert message.startswith("content\n\n[warning: 'read' has been called in")
    [seventh] = last_tool_messages(model.requests[7])
    assert seventh.startswith("Not executed: 'read' was called in 7 steps in a row")
    assert model.requests[7].tools == []
    assert "Stop using tools now" in model.requests[7].messages[-1]["content"]
    assert "tool.repetition_warning" in journal.event_types()
    assert "tool.finalize" in journal.event_types()


def test_calls_after_a_forced_finalisation_in_the_same_step_are_not_run() -> None:
    read = RecordingTool("read")
    model = ScriptedModel(
        *[calls(("read", {"n": n})) for n in range(6)],
        calls(("read", {"n": 6}), ("read", {"n": 7})),
        text("Summary."),
    )
    invoke(make_invoker(model, [read]))
    assert len(read.finished) == 6
    seventh, eighth = last_tool_messages(model.requests[7])
    assert seventh.startswith("Not executed: 'read' was called in 7 steps in a row")
    assert eighth.startswith("Not executed: the loop is finishing")

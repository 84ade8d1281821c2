"""Context compaction: the pure reduction, and the loop's use of it (including the re-issue
after a provider's context-overflow error)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.compaction import compact, estimate_tokens, group_messages
from runtime.invocation import OutcomeKind
from runtime.types import ContextOverflow, Message
from tests.support.fake_model import (
    RecordingTool,
    ScriptedModel,
    calls,
    invoke,
    make_invoker,
    text,
)
from tests.support.journal import MemoryJournal, SimulatedCrash

HEAD: list[Message] = [
    {"role": "system", "content": "You are a maker."},
    {"role": "user", "content": "Goal: do it."},
]


def exchange(n: int, output_chars: int, calls_in_step: int = 1) -> list[Message]:
    ids = [f"c{n}_{i}" for i in range(calls_in_step)]
    assistant: Message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": "read", "arguments": "{}"}}
            for i in ids
        ],
    }
    results = [{"role": "tool", "tool_call_id": i, "content": "x" * output_chars} for i in ids]
    return [assistant, *results]


def history(sizes: list[int]) -> list[Message]:
    return [*HEAD, *(m for n, size in enumerate(sizes) for m in exchange(n, size))]


def assert_pairs_intact(messages: list[Message]) -> None:
    """Every tool result follows the assistant message that called it, and vice versa."""
    open_ids: set[str] = set()
    for message in messages:
        if message["role"] == "assistant":
            assert not open_ids, f"calls {open_ids} lost their results"
            open_ids = {c["id"] for c in message.get("tool_calls") or []}
        elif message["role"] == "tool":
            assert message["tool_call_id"] in open_ids, "a result without its call"
            open_ids.discard(message["tool_call_id"])
        else:
            open_ids = set()
    assert not open_ids


def test_a_history_within_budget_is_left_alone() -> None:
    messages = history([100, 100])
    result = compact(messages, budget_tokens=10_000)
    assert result.messages == messages
    assert not result.changed


def test_old_tool_outputs_are_pruned_first() -> None:
    messages = history([4000, 4000, 100, 100, 100, 100])
    result = compact(messages, budget_tokens=estimate_tokens(messages) - 500)
    assert result.pruned_outputs >= 1
    assert result.dropped_messages == 0
    assert len(result.messages) == len(messages)
    assert result.messages[3]["content"].startswith("[output pruned to save context: 4,000")
    assert result.messages[:2] == HEAD
    assert result.tokens_after <= result.tokens_before - 500


def test_oldest_exchanges_are_dropped_whole_with_a_note_when_pruning_is_not_enough() -> None:
    messages = history([300] * 10)
    result = compact(messages, budget_tokens=500)
    assert result.messages[:2] == HEAD
    assert result.dropped_messages > 0
    assert result.messages[2]["role"] == "user"
    assert f"{result.dropped_messages} earlier messages" in result.messages[2]["content"]
    assert result.messages[-8:] == messages[-8:]  # the 4 most recent exchanges are kept
    assert_pairs_intact(result.messages)


def test_a_forced_compaction_keeps_only_the_last_exchange_and_shortens_it() -> None:
    messages = history([300] * 6 + [20_000])
    result = compact(messages, budget_tokens=1_000, keep_recent=1)
    assert result.messages[:2] == HEAD
    assert result.messages[-2]["tool_calls"][0]["id"] == "c6_0"
    assert result.shortened_outputs == 1
    assert "[output truncated" in result.messages[-1]["content"]
    assert result.tokens_after <= 1_000
    assert_pairs_intact(result.messages)


def test_groups_keep_a_call_with_all_its_results() -> None:
    messages = [*HEAD, *exchange(0, 10, calls_in_step=3), {"role": "user", "content": "note"}]
    groups = group_messages(messages[2:])
    assert [len(g) for g in groups] == [4, 1]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3000), st.integers(1, 3)),
        min_size=0,
        max_size=12,
    ),
    st.integers(50, 5000),
    st.sampled_from([1, 4]),
)
def test_compaction_never_splits_calls_from_results_and_never_touches_the_head(
    steps: list[tuple[int, int]], budget: int, keep_recent: int
) -> None:
    messages = [*HEAD]
    for n, (size, count) in enumerate(steps):
        messages.extend(exchange(n, size, count))
    result = compact(messages, budget_tokens=budget, keep_recent=keep_recent)
    assert result.messages[:2] == HEAD
    assert_pairs_intact(result.messages)
    if steps:  # the latest exchange is always there (possibly shortened)
        last_call = messages[-(steps[-1][1] + 1)]
        assert last_call in result.messages
    assert result.tokens_after <= max(result.tokens_before, 0)


# --- in the loop -------------------------------------------------------------------------------


def big_reads(count: int, chars: int) -> tuple[RecordingTool, ScriptedModel]:
    read = RecordingTool("read", result="y" * chars)
    model = ScriptedModel(*[calls(("read", {"n": n})) for n in range(count)], text("Done."))
    return read, model


def test_the_loop_compacts_before_a_step_that_would_not_fit_and_records_it() -> None:
    read, model = big_reads(6, 4_000)
    outcome, journal = invoke(
        make_invoker(model, [read], context_window_tokens=4_000, response_reserve_tokens=1_000)
    )
    assert outcome.output == {"text": "Done."}
    for request in model.requests:
        assert request.messages[1]["content"].startswith("Goal:")
        assert estimate_tokens(request.messages, request.tools) <= 3_000
    compactions = [data for type_, data in journal.events if type_ == "context.compacted"]
    assert compactions
    assert compactions[0]["forced"] is False
    assert compactions[0]["tokens_after"] < compactions[0]["tokens_before"]
    recorded = [s.request.get("compaction") for s in journal.of_kind("model")]
    assert any(recorded)


def test_a_context_overflow_forces_a_harder_compaction_and_one_reissue() -> None:
    read = RecordingTool("read", result="y" * 2_000)
    model = ScriptedModel(
        calls(("read", {"n": 1})),
        calls(("read", {"n": 2})),
        ContextOverflow("maximum context length is 1000 tokens, you requested 1400 tokens"),
        text("Done."),
    )
    outcome, journal = invoke(make_invoker(model, [read]))
    assert outcome.output == {"text": "Done."}
    overflowed, reissued = model.requests[2], model.requests[3]
    assert estimate_tokens(reissued.messages, reissued.tools) < estimate_tokens(
        overflowed.messages, overflowed.tools
    )
    [event] = [data for type_, data in journal.events if type_ == "context.compacted"]
    assert event["forced"] is True
    models = journal.of_kind("model")
    assert len(models) == 3  # the overflowing attempt left no step behind
    assert models[-1].request["budget_tokens"] < models[0].request["budget_tokens"]


def test_a_second_overflow_fails_the_invocation_with_a_clear_reason() -> None:
    model = ScriptedModel(
        ContextOverflow("maximum context length is 10 tokens, you requested 300"),
        ContextOverflow("maximum context length is 10 tokens, still 300"),
    )
    outcome, journal = invoke(make_invoker(model, []))
    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.code == "context_overflow"
    assert "does not fit the model's context window" in outcome.reason
    assert journal.of_kind("model") == []


def test_a_reduced_budget_is_kept_for_later_steps_and_across_a_resume() -> None:
    read = RecordingTool("read", result="y" * 3_000)
    model = ScriptedModel(
        calls(("read", {"n": 1})),
        ContextOverflow("maximum context length is 1000 tokens, you requested 1500 tokens"),
        calls(("read", {"n": 2})),
    )
    journal = MemoryJournal()
    journal.crash_after_next("complete", "tool", count=2)
    with pytest.raises(SimulatedCrash):
        invoke(make_invoker(model, [read]), journal)
    # A new worker picks the invocation up: the budget comes back from the journal.
    outcome, journal = invoke(make_invoker(ScriptedModel(text("Done.")), [read]), journal)
    assert outcome.output == {"text": "Done."}
    budgets = [s.request["budget_tokens"] for s in journal.of_kind("model")]
    assert budgets[0] > budgets[1] == budgets[2]

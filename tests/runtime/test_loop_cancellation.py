"""Cancellation reaches the model call and running tools; tools not yet started never start.
A lost lease propagates unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from runtime.invocation import InvocationOutcome, LeaseLost
from tests.support.fake_model import (
    Hang,
    RecordingTool,
    ScriptedModel,
    calls,
    make_invoker,
    make_request,
    text,
)
from tests.support.journal import MemoryJournal


async def cancel_when(
    event: asyncio.Event, coroutine: Coroutine[Any, Any, InvocationOutcome]
) -> asyncio.Task[InvocationOutcome]:
    """Run ``coroutine`` until ``event`` is set, then cancel it and expect it to end so."""
    task = asyncio.ensure_future(coroutine)
    await asyncio.wait_for(event.wait(), timeout=5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return task


def test_cancelling_reaches_a_running_tool_and_skips_those_not_started() -> None:
    slow = RecordingTool("slow", sleep=30)
    model = ScriptedModel(calls(("slow", {"n": 1}), ("slow", {"n": 2}), ("slow", {"n": 3})))
    journal = MemoryJournal()
    invoker = make_invoker(model, [slow], tool_concurrency=1)

    asyncio.run(cancel_when(slow.started, invoker.invoke(make_request(), journal)))

    assert slow.cancelled == 1
    assert [arguments for arguments, _ in slow.calls] == [{"n": 1}]  # 2 and 3 never started
    [context] = [context for _, context in slow.calls]
    assert context.cancelled.is_set()
    # Only the started call left a trace: a started step, re-issued if the run is resumed.
    [step] = journal.of_kind("tool")
    assert (step.status, step.request["arguments"]) == ("started", {"n": 1})


def test_cancelling_reaches_the_model_call() -> None:
    hang = Hang()
    model = ScriptedModel(hang)
    journal = MemoryJournal()
    invoker = make_invoker(model, [])

    asyncio.run(cancel_when(hang.started, invoker.invoke(make_request(), journal)))

    assert hang.cancelled
    assert journal.rows == []


def test_cancelling_a_later_model_call_keeps_the_earlier_steps() -> None:
    hang = Hang()
    read = RecordingTool("read")
    model = ScriptedModel(calls(("read", {})), hang)
    journal = MemoryJournal()

    asyncio.run(
        cancel_when(hang.started, make_invoker(model, [read]).invoke(make_request(), journal))
    )

    assert [(s.kind, s.status) for s in journal.rows] == [
        ("model", "completed"),
        ("tool", "completed"),
    ]


def test_a_lost_lease_during_tool_calls_propagates_unchanged_and_stops_the_others() -> None:
    journal = MemoryJournal()

    def lose_lease(arguments: dict[str, object]) -> str:
        journal.lease_lost = True
        return "done"

    fast = RecordingTool("fast", result=lose_lease)
    slow = RecordingTool("slow", sleep=30)
    model = ScriptedModel(calls(("slow", {}), ("fast", {})))
    invoker = make_invoker(model, [fast, slow])
    with pytest.raises(LeaseLost):
        asyncio.run(invoker.invoke(make_request(), journal))
    assert slow.cancelled == 1


def test_a_lost_lease_when_recording_a_model_step_propagates_unchanged() -> None:
    journal = MemoryJournal(lease_lost=True)
    with pytest.raises(LeaseLost):
        asyncio.run(make_invoker(ScriptedModel(text("hi")), []).invoke(make_request(), journal))

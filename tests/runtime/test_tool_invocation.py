"""Every tool call's context carries the invocation making it (``ToolContext.invocation``), set
by the loop from the request: a read run before its step is written, a call begun first, and a
call re-issued after a crash all get the same plain data, so no tool looks up its caller."""

from __future__ import annotations

import pytest

from runtime.invocation import InvocationRequest, LoopRole
from runtime.loop import ToolLoopInvoker, tool_invocation
from runtime.tools.base import Invocation
from runtime.types import Effect
from tests.support.fake_model import (
    RecordingTool,
    ScriptedModel,
    calls,
    invoke,
    make_invoker,
    make_request,
    text,
)
from tests.support.journal import MemoryJournal, SimulatedCrash

SETTINGS = {"tools": {"allow": ["*"]}, "isolation": {"networkAccess": "deny"}}


def _request() -> InvocationRequest:
    return make_request(
        role=LoopRole.MAKER,
        invocation="maker:1",
        employee_username="ada",
        harness={"profile": {"tag": "default", "version": 3}, "settings": SETTINGS},
        context={"auto_allowlist": ["write"]},
    )


def _bound(invoker: ToolLoopInvoker) -> ToolLoopInvoker:
    invoker.bound_tools = ("read", "write")
    return invoker


def test_the_invocation_is_built_from_the_request_alone() -> None:
    request = _request()
    assert tool_invocation(request, ["read"]) == Invocation(
        run_id=request.run_id,
        role="maker",
        name="maker:1",
        employee="ada",
        harness=SETTINGS,
        bound_tools=frozenset({"read"}),
        auto_allowlist=frozenset({"write"}),
    )
    # No snapshot: no harness (whatever must be allowed by it is then denied).
    bare = make_request(harness={})
    assert tool_invocation(bare).harness is None
    assert tool_invocation(bare).bound_tools == frozenset()


def test_reads_run_first_and_begun_calls_carry_the_invocation() -> None:
    read = RecordingTool("read", result="contents")
    write = RecordingTool("write", Effect.WRITE)
    model = ScriptedModel(calls(("read", {"path": "a"}), ("write", {"path": "b"})), text("Done."))
    request = _request()
    invoker = _bound(make_invoker(model, [read, write]))
    outcome, journal = invoke(invoker, MemoryJournal(reads_run_first=True), request)
    assert outcome.output == {"text": "Done."}
    # The read ran before anything of its step was written; the write was begun first.
    ops = [(op, kind) for op, kind, _ in journal.writes]
    assert ("record_call", "tool") in ops and ("begin", "tool") in ops
    expected = tool_invocation(request, ("read", "write"))
    for tool in (read, write):
        [(_, context)] = tool.calls
        assert context.invocation == expected


def test_bound_tools_may_be_given_per_request() -> None:
    read = RecordingTool("read")
    invoker = make_invoker(ScriptedModel(calls(("read", {})), text("Done.")), [read])
    invoker.bound_tools = lambda request: [f"tool-of-{request.employee_username}"]
    invoke(invoker, None, _request())
    [(_, context)] = read.calls
    assert context.invocation is not None
    assert context.invocation.bound_tools == frozenset({"tool-of-ada"})


def test_a_call_reissued_after_a_crash_carries_the_invocation() -> None:
    write = RecordingTool("write", Effect.WRITE)
    request = _request()
    journal = MemoryJournal()
    journal.crash_after_next("begin", "tool")
    model = ScriptedModel(calls(("write", {"path": "a"})))
    with pytest.raises(SimulatedCrash):
        invoke(_bound(make_invoker(model, [write])), journal, request)
    assert write.calls == []  # begun, never run: the crash came first

    outcome, _ = invoke(
        _bound(make_invoker(ScriptedModel(text("Done.")), [write])), journal, request
    )
    assert outcome.output == {"text": "Done."}
    [(_, context)] = write.calls
    assert context.reissued
    assert context.invocation == tool_invocation(request, ("read", "write"))

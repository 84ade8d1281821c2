"""The ``todo`` tool: add / update / list, per invocation, restored from the journal on resume."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from runtime.invocation import InvocationRequest, LoopRole, OutcomeKind
from runtime.loop import LoopSettings, ToolLoopInvoker
from runtime.policy import ToolPolicy
from runtime.tools import ToolRegistry
from runtime.tools.base import ToolContext, ToolError
from runtime.tools.subagents import invoke_scoped
from runtime.tools.todo import TodoTool, todos_of
from tests.subagents.support import client_of
from tests.support.journal import MemoryJournal, SimulatedCrash
from tests.support.model_server import Completion, ModelServer

pytestmark = pytest.mark.anyio


def todo(**arguments: Any) -> tuple[str, str]:
    return ("todo", json.dumps(arguments))


def context() -> ToolContext:
    return ToolContext(workdir=None, idempotency_key="k", deadline=1e18)


async def test_add_update_and_list() -> None:
    tool = TodoTool()
    ctx = context()
    first = await tool.run({"add": ["read the code", "fix the bug"]}, ctx)
    assert todos_of(first.content) == [
        {"id": 1, "title": "read the code", "status": "pending"},
        {"id": 2, "title": "fix the bug", "status": "pending"},
    ]
    second = await tool.run(
        {"update": [{"id": 1, "status": "completed"}, {"id": 2, "status": "in_progress"}]}, ctx
    )
    assert [i["status"] for i in todos_of(second.content) or []] == ["completed", "in_progress"]
    listed = await tool.run({}, ctx)
    assert "2 item(s), 1 completed" in listed.content
    with pytest.raises(ToolError, match="No todo item 9; the ids are: 1, 2"):
        await tool.run({"update": [{"id": 9, "status": "completed"}], "add": ["x"]}, ctx)
    # All or nothing: the refused call added nothing.
    assert len(todos_of((await tool.run({}, ctx)).content) or []) == 2


def _loop(server: ModelServer, tool: TodoTool) -> ToolLoopInvoker:
    return ToolLoopInvoker(
        model_clients=lambda _u: client_of(server),
        tools=ToolRegistry([tool]),
        policy=lambda _r: ToolPolicy.from_decisions({"todo": "allow"}),
        settings=LoopSettings(max_steps=6),
    )


async def test_the_list_is_restored_from_the_journal_after_a_crash(
    make_model_server: Callable[[], ModelServer],
) -> None:
    server = make_model_server()
    request = InvocationRequest(
        run_id=uuid.uuid4(),
        role=LoopRole.MAKER,
        invocation="maker:0",
        employee_username="e",
        goal="work",
        harness={"settings": {}},
    )
    journal = MemoryJournal()
    server.queue(Completion(tool_calls=[todo(add=["a", "b"])]))
    journal.crash_after_next("complete", "tool")
    with pytest.raises(SimulatedCrash):
        await invoke_scoped(_loop(server, TodoTool()), request, journal)
    # A new worker: a new tool, the list comes back from the persisted step.
    server.queue(
        Completion(tool_calls=[todo(update=[{"id": 1, "status": "completed"}])]),
        Completion(content="all done"),
    )
    outcome = await invoke_scoped(_loop(server, TodoTool()), request, journal)
    assert outcome.kind is OutcomeKind.COMPLETED
    last = [m for m in server.bodies[-1]["messages"] if m["role"] == "tool"][-1]["content"]
    assert todos_of(last) == [
        {"id": 1, "title": "a", "status": "completed"},
        {"id": 2, "title": "b", "status": "pending"},
    ]

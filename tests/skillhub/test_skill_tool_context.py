"""A skill tool knows its caller only from its context's invocation (plain data), never from a
row: without one it is refused with a clear message; with one, the employee's access (scope,
bound tools) and the harness's decision come from that data and the skill's own rows, and the
execution is attributed to it. No run or step row exists in these tests."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from runtime.tools.base import Invocation, ToolContext, ToolError
from skillhub.models import Skill, SkillExecution
from skillhub.tools import NO_INVOCATION, SKILL_TOOLS

# The tool reads the skill in a pool thread (its own connection): the rows must be committed.
pytestmark = pytest.mark.django_db(transaction=True)
RUN = uuid.UUID("00000000-0000-4000-8000-000000000016")


def _harness(**tools: Any) -> dict[str, Any]:
    from harness.schema import DEFAULT_PLATFORM

    settings = {k: dict(v) for k, v in DEFAULT_PLATFORM.items()}
    settings["tools"] = {**settings["tools"], **tools}
    settings["isolation"]["networkAccess"] = "deny"
    return settings


def _invocation(**fields: Any) -> Invocation:
    values: dict[str, Any] = {
        "run_id": RUN, "role": "maker", "name": "maker:0", "employee": "ann",
        "harness": _harness(allow=["*"]), "bound_tools": frozenset(),
    }  # fmt: skip
    values.update(fields)
    return Invocation(**values)


def _call(name: str, arguments: dict[str, Any], invocation: Invocation | None) -> str:
    SKILL_TOOLS.invalidate()
    tool = SKILL_TOOLS.get(name)
    assert tool is not None, name
    context = ToolContext(
        workdir=None,
        idempotency_key=f"{RUN}:3:0",
        deadline=time.monotonic() + 1.0,
        invocation=invocation,
    )
    return asyncio.run(tool.run(arguments, context)).content


@pytest.mark.parametrize("tool", ["skill_hub_py_add", "skill_hub_execute"])
def test_a_call_with_no_invocation_in_its_context_is_refused(
    make_skill: Callable[..., Skill], tool: str
) -> None:
    make_skill("py_add")
    arguments = {"a": 1} if tool == "skill_hub_py_add" else {"toolName": "py_add"}
    with pytest.raises(ToolError) as refused:
        _call(tool, arguments, None)
    assert str(refused.value) == NO_INVOCATION
    assert "only inside a loop run" in NO_INVOCATION
    assert not SkillExecution.objects.exists()


def test_scope_and_bound_tools_come_from_the_invocation(
    make_skill: Callable[..., Skill],
) -> None:
    from orchestrator.agents.services import employee_create, model_endpoint_create

    endpoint = model_endpoint_create(
        name="unused", provider="openai", base_url="http://127.0.0.1:9/v1", model="none"
    )
    employee_create(username="bob", endpoint=endpoint, tools=[])
    make_skill("py_add", tool_scope="custom")
    make_skill("py_named", tool_scope="specified", employees=["bob"])
    with pytest.raises(ToolError, match="not available to employee 'ann'"):
        _call("skill_hub_py_add", {"a": 1}, _invocation())
    with pytest.raises(ToolError, match="not available to employee 'ann'"):
        _call("skill_hub_py_named", {"a": 1}, _invocation())
    assert not SkillExecution.objects.exists()
    # Binding the skill's own tool (the invocation's bound tools) opens a custom-scope skill;
    # no worker runs it here, so the call ends at its deadline with the execution queued.
    bound = _invocation(bound_tools=frozenset({"skill_hub_py_add"}))
    with pytest.raises(ToolError, match="did not finish in time"):
        _call("skill_hub_py_add", {"a": 1}, bound)
    [execution] = SkillExecution.objects.all()
    assert (execution.principal, execution.run_id) == ("employee:ann", RUN)
    assert execution.idempotency_key == f"{RUN}:3:0"


def test_the_harness_decision_comes_from_the_invocation(
    make_skill: Callable[..., Skill],
) -> None:
    make_skill("py_add")
    with pytest.raises(ToolError, match="No harness snapshot"):
        _call("skill_hub_py_add", {"a": 1}, _invocation(harness=None))
    denying = _invocation(harness=_harness(allow=["*"], deny=["skill_hub_py_add"]))
    with pytest.raises(ToolError, match="harness denies skill_hub_py_add"):
        _call("skill_hub_py_add", {"a": 1}, denying)
    # The generic tool may not take a call the harness gates, unless the pattern waives it.
    asking = _invocation(harness=_harness(allow=[]))
    generic = {"toolName": "py_add", "inputs": {"a": 1}}
    with pytest.raises(ToolError, match="requires approval"):
        _call("skill_hub_execute", generic, asking)
    waived = _invocation(harness=_harness(allow=[]), auto_allowlist=frozenset({"skill_hub_py_add"}))
    with pytest.raises(ToolError, match="did not finish in time"):
        _call("skill_hub_execute", generic, waived)
    assert SkillExecution.objects.get().principal == "employee:ann"

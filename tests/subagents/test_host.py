"""The Django host: bindings from rows, children from employee rows under their parent's
harness tightened by their own layers, the binding's model override; real model servers."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from harness.services import harness_snapshot, profile_create
from orchestrator.agents import services
from orchestrator.agents.models import Employee, ModelEndpoint
from orchestrator.agents.subagent_host import agent_tools_register, child_harness
from orchestrator.agents.wiring import EmployeeProfile, ProfileCache, employee_tool_registry
from runtime.invocation import InvocationRequest, LoopRole, OutcomeKind
from runtime.loop import LoopSettings, ToolLoopInvoker
from runtime.policy import ToolPolicy
from runtime.tools.base import Invocation
from runtime.tools.ephemeral import EphemeralJournal
from runtime.tools.subagents import invoke_scoped
from tests.subagents.support import client_of
from tests.support.model_server import Completion, ModelServer

pytestmark = pytest.mark.django_db(transaction=True)
TAG = "sub-team"


@pytest.fixture(autouse=True)
def team_profile() -> None:
    """Every tool allowed; writes ask (a profile trusts nothing it does not name)."""
    profile_create(tag=TAG, settings={"tools": {"allow": ["*"]}})


def endpoint(name: str, server: ModelServer, model: str = "child-model") -> ModelEndpoint:
    return ModelEndpoint.objects.create(name=name, base_url=server.url, model=model, max_retries=0)


def dispatch(employee: str, task: str) -> tuple[str, str]:
    return ("dispatch_sub_agent_task", json.dumps({"employee": employee, "task": task}))


def run_parent(
    boss_server: ModelServer, tmp_path: Path, harness: dict[str, Any], level: str = "L1"
) -> Any:
    tools = agent_tools_register(employee_tool_registry(tmp_path / "ledger"), ProfileCache())
    loop = ToolLoopInvoker(
        model_clients=lambda _u: client_of(boss_server, "boss"),
        tools=tools,
        policy=lambda _r: ToolPolicy.from_decisions({"dispatch_sub_agent_task": "allow"}),
        settings=LoopSettings(max_steps=4),
    )
    request = InvocationRequest(
        run_id=uuid.uuid4(),
        role=LoopRole.MAKER,
        invocation="maker:0",
        employee_username="boss",
        goal="lead",
        harness=harness,
        context={"autonomy_level": level},
        workdir=str(tmp_path),
    )

    async def go() -> Any:
        try:
            return await invoke_scoped(loop, request, EphemeralJournal())
        finally:
            await sync_to_async(connections.close_all)()

    return asyncio.run(go())


def test_a_bound_employee_runs_with_the_bindings_model_and_a_tighter_harness(
    make_model_server: Callable[[], ModelServer], tmp_path: Path
) -> None:
    boss_server, child_server = make_model_server(), make_model_server()
    (tmp_path / "notes.txt").write_text("the answer is 42")
    boss = services.employee_create(
        username="boss",
        endpoint=endpoint("boss-ep", boss_server),
        tools=["dispatch_sub_agent_task"],
    )
    helper = services.employee_create(
        username="helper",
        endpoint=endpoint("helper-ep", child_server),
        system_prompt="HELPER",
        tools=["read", "write", "bash"],
        harness={"limits": {"maxToolCalls": 7}, "tools": {"deny": ["bash"]}},
    )
    services.sub_agent_binding_create(parent=boss, child=helper, model="override-model")
    boss_server.queue(
        Completion(tool_calls=[dispatch("helper", "What does notes.txt say?")]),
        Completion(content="42"),
    )
    child_server.queue(
        Completion(tool_calls=[("read", json.dumps({"path": "notes.txt"}))]),
        Completion(content="It says the answer is 42."),
    )
    snapshot = harness_snapshot(tag=TAG, employee_username="boss")
    outcome = run_parent(boss_server, tmp_path, snapshot)
    assert outcome.kind is OutcomeKind.COMPLETED, outcome
    first = child_server.bodies[0]
    assert first["model"] == "override-model"
    assert first["messages"][0]["content"].startswith("HELPER\n\nYou are a sub-agent")
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    # The profile asks for writes: a sub-agent cannot wait, so it is not offered;
    # bash is denied by the child's own layer.
    assert [t["function"]["name"] for t in first["tools"]] == ["read"]
    [result] = [m["content"] for m in boss_server.bodies[1]["messages"] if m["role"] == "tool"]
    assert "concluded:\nIt says the answer is 42." in result
    assert "the answer is 42" in child_server.bodies[1]["messages"][-1]["content"]


def test_the_child_harness_keeps_the_parents_provenance_and_adds_its_own_layers(
    model_server: ModelServer,
) -> None:
    snapshot = harness_snapshot(
        tag=TAG, pattern_layer={"delegation": {"maxCount": 2}}, employee_username="boss"
    )
    parent = Invocation(
        run_id=uuid.uuid4(),
        role="maker",
        name="maker:0",
        employee="boss",
        harness=snapshot["settings"],
        harness_provenance=snapshot["provenance"],
    )
    profile = EmployeeProfile(
        username="helper",
        system_prompt="",
        tools=(),
        loop_settings=LoopSettings(),
        client=client_of(model_server),
        harness_layer={"limits": {"maxTokens": 5}, "delegation": {"maxDepth": 0}},
    )
    child = child_harness(parent, profile)
    assert child["settings"]["limits"]["maxTokens"] == 5
    assert child["provenance"]["limits.maxTokens"] == "employee:helper"
    assert child["settings"]["delegation"]["maxCount"] == 2
    assert child["provenance"]["delegation.maxCount"] == "pattern"
    assert child["settings"]["delegation"]["maxDepth"] == 0
    assert child["layers"] == ["parent:maker:0", "employee:helper"]
    assert Employee.objects.count() == 0


def test_a_profiles_delegation_section_binds_the_dispatch(
    make_model_server: Callable[[], ModelServer], tmp_path: Path
) -> None:
    boss_server, child_server = make_model_server(), make_model_server()
    profile_create(
        tag="sub-limits",
        settings={
            "tools": {"allow": ["*"]},
            "delegation": {"allowedEmployees": ["helper"], "maxCount": 1},
        },
    )
    boss = services.employee_create(username="boss", endpoint=endpoint("boss-ep", boss_server))
    helper = services.employee_create(username="helper", endpoint=endpoint("h-ep", child_server))
    spare = services.employee_create(username="spare", endpoint=endpoint("s-ep", child_server))
    services.sub_agent_binding_create(parent=boss, child=helper)
    services.sub_agent_binding_create(parent=boss, child=spare)
    boss_server.queue(
        Completion(
            tool_calls=[dispatch("helper", "a"), dispatch("helper", "b"), dispatch("spare", "c")]
        ),
        Completion(content="done"),
    )
    child_server.always(Completion(content="fine"))
    outcome = run_parent(boss_server, tmp_path, harness_snapshot(tag="sub-limits"))
    assert outcome.kind is OutcomeKind.COMPLETED
    results = [m["content"] for m in boss_server.bodies[1]["messages"] if m["role"] == "tool"]
    assert sum("concluded:\nfine" in r for r in results[:2]) == 1
    assert (
        sum(
            "Refused: delegation.maxCount = 1 (set by profile:sub-limits@1)" in r
            for r in results[:2]
        )
        == 1
    )
    assert results[2] == (
        "Error: Refused: 'spare' is not in delegation.allowedEmployees = [\"helper\"] "
        "(set by profile:sub-limits@1)."
    )
    assert len(child_server.bodies) == 1


def test_a_bindings_endpoint_override_sends_the_child_to_that_endpoint(
    make_model_server: Callable[[], ModelServer], tmp_path: Path
) -> None:
    boss_server, own_server, other_server = (make_model_server() for _ in range(3))
    boss = services.employee_create(username="boss", endpoint=endpoint("boss-ep", boss_server))
    helper = services.employee_create(username="helper", endpoint=endpoint("own", own_server))
    other = endpoint("other", other_server, model="other-model")
    services.sub_agent_binding_create(parent=boss, child=helper, endpoint=other)
    boss_server.queue(Completion(tool_calls=[dispatch("helper", "hi")]), Completion(content="k"))
    other_server.queue(Completion(content="from the other endpoint"))
    outcome = run_parent(boss_server, tmp_path, harness_snapshot(tag=TAG))
    assert outcome.kind is OutcomeKind.COMPLETED
    assert own_server.bodies == []
    assert other_server.bodies[0]["model"] == "other-model"

"""``dispatch_sub_agent_task`` in the runtime: isolation, depth, counts, alternatives, usage,
the parent's deadline; real model servers over HTTP, no Django."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from runtime.invocation import OutcomeKind
from runtime.tools.ephemeral import EphemeralJournal
from runtime.tools.subagents import BoundSubAgent, invoke_scoped, sub_agent_depth
from tests.subagents.support import (
    ChildSpec,
    StaticHost,
    delegation,
    parent_loop,
    parent_request,
)
from tests.support.model_server import Completion, Delay, Error, ModelServer

pytestmark = pytest.mark.anyio

Servers = Callable[[], ModelServer]


def dispatch(employee: str, task: str, context: str | None = None) -> tuple[str, str]:
    arguments: dict[str, Any] = {"employee": employee, "task": task}
    if context is not None:
        arguments["context"] = context
    return ("dispatch_sub_agent_task", json.dumps(arguments))


def tool_results(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def host_with(children: dict[str, ChildSpec], **alternatives: tuple[str, ...]) -> StaticHost:
    bindings = [
        BoundSubAgent(child=name, alternatives=alternatives.get(name, ()))
        for name in children
        if name in alternatives or not any(name in a for a in alternatives.values())
    ]
    return StaticHost(bindings_of={"boss": bindings}, children=children)


async def test_the_child_sees_only_its_system_prompt_and_the_task(
    make_model_server: Servers,
) -> None:
    boss, helper = make_model_server(), make_model_server()
    boss.queue(
        Completion(tool_calls=[dispatch("helper", "Add 2 and 2.", "The numbers are small.")]),
        Completion(content="The helper says 4."),
    )
    helper.queue(Completion(content="  4  ", usage=(30, 7)))
    host = host_with({"helper": ChildSpec(helper, prompt="HELPER PROMPT")})
    journal = EphemeralJournal()
    usage: list[tuple[int, int, float]] = []
    outcome = await invoke_scoped(
        parent_loop(boss, host),
        parent_request(delegation()),
        journal,
        usage=lambda i, o, c: usage.append((i, o, c)),
    )
    assert outcome.kind is OutcomeKind.COMPLETED, outcome
    first = helper.bodies[0]["messages"]
    assert [m["role"] for m in first] == ["system", "user"]
    assert first[0]["content"] == "HELPER PROMPT"
    assert "Add 2 and 2." in first[1]["content"]
    assert "The numbers are small." in first[1]["content"]
    assert "PARENT SECRET GOAL" not in json.dumps(helper.bodies)
    # The distilled conclusion is what the parent reads.
    [result] = tool_results(boss.bodies[1])
    assert result.endswith("concluded:\n4")
    assert "helper" in result
    # Usage of the child reaches the parent's sink (merged into the parent's usage).
    assert usage == [(30, 7, 0.0)]


async def test_a_call_beyond_max_depth_is_a_tool_error(make_model_server: Servers) -> None:
    boss, helper = make_model_server(), make_model_server()
    boss.queue(Completion(tool_calls=[dispatch("helper", "x")]), Completion(content="alone"))
    host = host_with({"helper": ChildSpec(helper)})
    request = parent_request(delegation(depth=1), name="maker:0/sub:3.0")
    assert sub_agent_depth(request.invocation) == 1
    outcome = await invoke_scoped(parent_loop(boss, host), request, EphemeralJournal())
    assert outcome.kind is OutcomeKind.COMPLETED
    [result] = tool_results(boss.bodies[1])
    assert result.startswith("Error: Refused: this would be a sub-agent at depth 2")
    assert "delegation.maxDepth = 1 (set by profile:team@2)" in result
    assert helper.bodies == []


async def test_a_child_cannot_nest_deeper_than_max_depth(make_model_server: Servers) -> None:
    boss, helper, deeper = make_model_server(), make_model_server(), make_model_server()
    boss.queue(
        Completion(tool_calls=[dispatch("helper", "delegate further")]), Completion(content="done")
    )
    helper.queue(
        Completion(tool_calls=[dispatch("deeper", "even more")]), Completion(content="I did it")
    )
    host = StaticHost(
        bindings_of={"boss": [BoundSubAgent("helper")], "helper": [BoundSubAgent("deeper")]},
        children={
            "helper": ChildSpec(helper, tools=("dispatch_sub_agent_task",)),
            "deeper": ChildSpec(deeper),
        },
    )
    outcome = await invoke_scoped(
        parent_loop(boss, host), parent_request(delegation(depth=1)), EphemeralJournal()
    )
    assert outcome.kind is OutcomeKind.COMPLETED
    [refusal] = tool_results(helper.bodies[1])
    assert "Refused: this would be a sub-agent at depth 2" in refusal
    assert deeper.bodies == []


async def test_depth_two_allows_one_nested_child_tagged_by_its_name(
    make_model_server: Servers,
) -> None:
    boss, helper, deeper = make_model_server(), make_model_server(), make_model_server()
    boss.queue(Completion(tool_calls=[dispatch("helper", "a")]), Completion(content="done"))
    helper.queue(Completion(tool_calls=[dispatch("deeper", "b")]), Completion(content="mid"))
    deeper.queue(Completion(content="leaf"))
    host = StaticHost(
        bindings_of={"boss": [BoundSubAgent("helper")], "helper": [BoundSubAgent("deeper")]},
        children={
            "helper": ChildSpec(helper, tools=("dispatch_sub_agent_task",)),
            "deeper": ChildSpec(deeper),
        },
    )
    events: list[dict[str, Any]] = []
    outcome = await invoke_scoped(
        parent_loop(boss, host),
        parent_request(delegation(depth=2)),
        EphemeralJournal(),
        events=events.append,
    )
    assert outcome.kind is OutcomeKind.COMPLETED
    assert "concluded:\nleaf" in tool_results(helper.bodies[1])[0]
    started = [(e["depth"], e["employee"]) for e in events if e["type"] == "sub_agent_started"]
    assert started == [(1, "helper"), (2, "deeper")]
    assert all("task_id" in e for e in events)
    # The helper's own tool call is reported, tagged with the helper's task and depth.
    tools = [(e["type"], e["name"], e["depth"]) for e in events if e["type"].startswith("tool_")]
    assert tools == [
        ("tool_started", "dispatch_sub_agent_task", 1),
        ("tool_finished", "dispatch_sub_agent_task", 1),
    ]
    finished = [e for e in events if e["type"] == "sub_agent_finished"]
    assert [(e["depth"], e["outcome"]) for e in finished] == [(2, "completed"), (1, "completed")]


async def test_max_count_refuses_the_extra_call_of_an_invocation(
    make_model_server: Servers,
) -> None:
    boss, helper = make_model_server(), make_model_server()
    boss.queue(
        Completion(tool_calls=[dispatch("helper", "one"), dispatch("helper", "two")]),
        Completion(content="done"),
    )
    helper.always(Completion(content="ok"))
    host = host_with({"helper": ChildSpec(helper)})
    outcome = await invoke_scoped(
        parent_loop(boss, host), parent_request(delegation(count=1)), EphemeralJournal()
    )
    assert outcome.kind is OutcomeKind.COMPLETED
    results = tool_results(boss.bodies[1])
    assert sum("concluded" in r for r in results) == 1
    assert sum("Refused: delegation.maxCount = 1" in r for r in results) == 1
    assert len(helper.bodies) == 1


async def test_allowed_employees_and_bindings_refuse_other_children(
    make_model_server: Servers,
) -> None:
    boss, helper, other = make_model_server(), make_model_server(), make_model_server()
    boss.queue(
        Completion(tool_calls=[dispatch("helper", "one"), dispatch("stranger", "two")]),
        Completion(content="done"),
    )
    host = StaticHost(
        bindings_of={"boss": [BoundSubAgent("helper"), BoundSubAgent("other")]},
        children={"helper": ChildSpec(helper), "other": ChildSpec(other)},
    )
    await invoke_scoped(
        parent_loop(boss, host),
        parent_request(delegation(allowed=["other", "stranger"])),
        EphemeralJournal(),
    )
    first, second = tool_results(boss.bodies[1])
    assert "Refused: 'helper' is not in delegation.allowedEmployees" in first
    assert "'stranger' is not bound to boss" in second and "other" in second
    assert helper.bodies == [] and other.bodies == []


async def test_alternatives_run_in_order_when_the_childs_model_fails(
    make_model_server: Servers,
) -> None:
    boss, first, second = make_model_server(), make_model_server(), make_model_server()
    boss.queue(Completion(tool_calls=[dispatch("first", "work")]), Completion(content="done"))
    first.always(Error(400, {"error": {"message": "model is broken"}}))
    second.queue(Completion(content="second did it"))
    host = StaticHost(
        bindings_of={"boss": [BoundSubAgent("first", alternatives=("second",))]},
        children={"first": ChildSpec(first), "second": ChildSpec(second)},
    )
    outcome = await invoke_scoped(
        parent_loop(boss, host), parent_request(delegation()), EphemeralJournal()
    )
    assert outcome.kind is OutcomeKind.COMPLETED
    [result] = tool_results(boss.bodies[1])
    assert "Sub-agent second (maker:0/sub:1.0~1) concluded:\nsecond did it" in result
    assert [name for name, _ in host.built] == ["first", "second"]


async def test_the_child_has_a_lower_step_cap_and_the_parents_deadline(
    make_model_server: Servers,
) -> None:
    boss, helper = make_model_server(), make_model_server()
    boss.queue(Completion(tool_calls=[dispatch("helper", "slow")]), Completion(content="done"))
    helper.queue(Delay(5, Completion(content="too late")))
    host = host_with({"helper": ChildSpec(helper, max_steps=50)})
    started = time.monotonic()
    outcome = await invoke_scoped(
        parent_loop(boss, host, tool_timeout=1.5),
        parent_request(delegation()),
        EphemeralJournal(),
    )
    assert time.monotonic() - started < 4
    assert outcome.kind is OutcomeKind.COMPLETED
    [result] = tool_results(boss.bodies[1])
    assert "did not conclude" in result and "parent's time" in result
    [(_, limits)] = host.built
    assert limits.max_steps == 8 and 1.0 < limits.seconds < 1.5


async def test_a_human_gate_of_the_child_is_a_refusal_not_a_wait(
    make_model_server: Servers,
) -> None:
    boss, helper = make_model_server(), make_model_server()
    boss.queue(Completion(tool_calls=[dispatch("helper", "note it")]), Completion(content="ok"))
    helper.queue(Completion(content="cannot"))
    host = host_with(
        {"helper": ChildSpec(helper, tools=("todo",), decisions={"todo": ("ask", "reviewed")})}
    )
    await invoke_scoped(parent_loop(boss, host), parent_request(delegation()), EphemeralJournal())
    assert "tools" not in helper.bodies[0] or helper.bodies[0]["tools"] == []

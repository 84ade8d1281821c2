"""The harness ``delegation`` section binds: it is accepted beyond "off", compiles
most-restrictive-wins, and the tool plan denies ``dispatch_sub_agent_task`` when it allows no
sub-agent; the compile API previews it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from harness.planner import plan_tools
from harness.schema import DEFAULT_PLATFORM, settings_problems
from runtime.tools.subagents import SUB_AGENT_SPEC, SUB_AGENT_TOOL
from runtime.types import Effect, ToolSpec

READ = ToolSpec(name="read", description="", parameters={"type": "object"}, effect=Effect.READ)


def settings(**delegation: Any) -> dict[str, Any]:
    tools = {**DEFAULT_PLATFORM["tools"], "trustedPreHandlerTools": [SUB_AGENT_TOOL]}
    return {
        **DEFAULT_PLATFORM,
        "tools": tools,
        "delegation": {**DEFAULT_PLATFORM["delegation"], **delegation},
    }


def test_the_platform_allows_one_level_of_sub_agents_for_any_bound_employee() -> None:
    assert DEFAULT_PLATFORM["delegation"] == {
        "allowedEmployees": ["*"],
        "maxDepth": 1,
        "maxCount": 10,
    }


def test_delegation_values_beyond_off_are_accepted_within_bounds() -> None:
    assert settings_problems({"delegation": {"allowedEmployees": ["a"], "maxDepth": 3}}) == []
    problems = settings_problems({"delegation": {"maxDepth": 11, "maxCount": -1}})
    assert sorted(p["pointer"] for p in problems) == [
        "/delegation/maxCount",
        "/delegation/maxDepth",
    ]


@pytest.mark.parametrize(
    ("delegation", "reason"),
    [
        ({"maxDepth": 0}, "no sub-agent may run: delegation.maxDepth = 0"),
        ({"maxCount": 0}, "no sub-agent may run: delegation.maxCount = 0"),
        ({"allowedEmployees": []}, "no sub-agent may run: delegation.allowedEmployees = []"),
    ],
)
def test_the_plan_denies_the_dispatch_tool_when_delegation_allows_nothing(
    delegation: dict[str, Any], reason: str
) -> None:
    plan = plan_tools(settings(**delegation), [SUB_AGENT_SPEC, READ])
    assert plan.decisions()[SUB_AGENT_TOOL] == ("deny", reason)
    assert plan.decisions()["read"][0] == "allow"


def test_the_dispatch_tool_is_a_write_tool_gated_unless_trusted() -> None:
    trusted = plan_tools(settings(), [SUB_AGENT_SPEC]).decisions()[SUB_AGENT_TOOL]
    assert trusted[0] == "allow"
    untrusted = {**settings(), "tools": DEFAULT_PLATFORM["tools"] | {"trustedPreHandlerTools": []}}
    assert plan_tools(untrusted, [SUB_AGENT_SPEC]).decisions()[SUB_AGENT_TOOL] == (
        "ask",
        "write effect needs approval",
    )


def test_a_snapshot_without_a_delegation_section_denies_the_dispatch_tool() -> None:
    old = {"tools": settings()["tools"]}
    assert plan_tools(old, [SUB_AGENT_SPEC]).decisions()[SUB_AGENT_TOOL][0] == "deny"


@pytest.mark.django_db
def test_the_compile_api_previews_delegation_and_its_plan(
    api_client_for: Callable[[str], APIClient],
) -> None:
    client = api_client_for("viewer")
    body = {
        "tag": "default",
        "pattern": {"delegation": {"allowedEmployees": ["helper", "other"], "maxCount": 3}},
        "employee": {
            "username": "boss",
            "harness": {"delegation": {"allowedEmployees": ["helper"]}},
        },
        "tools": [{"name": SUB_AGENT_TOOL, "effect": "write"}],
    }
    response = client.post("/api/v1/harness-profiles/compile", body, format="json")
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["settings"]["delegation"] == {
        "allowedEmployees": ["helper"],
        "maxDepth": 1,
        "maxCount": 3,
    }
    assert data["provenance"]["delegation.allowedEmployees"] == "employee:boss"
    assert data["provenance"]["delegation.maxCount"] == "pattern"
    assert data["provenance"]["delegation.maxDepth"] == "platform"
    [planned] = data["toolPlan"]
    assert (planned["decision"], planned["tier"]) == ("ask", "write")
    body["overrides"] = {"delegation": {"maxDepth": 0}}
    denied = client.post("/api/v1/harness-profiles/compile", body, format="json").json()
    assert denied["toolPlan"][0]["decision"] == "deny"
    assert denied["toolPlan"][0]["reason"] == "no sub-agent may run: delegation.maxDepth = 0"

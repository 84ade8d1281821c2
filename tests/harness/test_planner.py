"""The tool plan: deny > ask > allow, effects as trust tiers, unenforceable tools blocked."""

from __future__ import annotations

from typing import Any

import pytest

from harness.compile import harness_compile, layer_from_settings, profile_layer
from harness.planner import plan_tools
from harness.schema import DEFAULT_PLATFORM, HarnessSettings, layer_validate
from runtime.policy import Decision
from runtime.types import Effect, ToolSpec


def spec(name: str, effect: Effect = Effect.READ, enforceable: bool = True) -> ToolSpec:
    return ToolSpec(
        name=name, description="", parameters={}, effect=effect, enforceable=enforceable
    )


def compiled(tools: dict[str, Any]) -> Any:
    platform = layer_from_settings("platform", HarnessSettings.model_validate(DEFAULT_PLATFORM))
    profile = profile_layer("profile:t@1", layer_validate({"tools": tools}))
    return harness_compile([platform, profile])


def outcome(tools: dict[str, Any], tool: ToolSpec) -> tuple[str, str]:
    planned = plan_tools(compiled(tools), [tool]).tools[0]
    return planned.decision.value, planned.reason


@pytest.mark.parametrize(
    ("tools", "tool", "expected"),
    [
        ({"allow": ["read"]}, spec("read"), ("allow", "allowed read tool")),
        ({"allow": ["*"]}, spec("read"), ("allow", "allowed read tool")),
        ({"allow": ["other"]}, spec("read"), ("ask", "not explicitly allowed")),
        ({"allow": []}, spec("read"), ("ask", "not explicitly allowed")),
        ({"allow": ["read"], "ask": ["read"]}, spec("read"), ("ask", "listed in tools.ask")),
        ({"allow": ["read"], "ask": ["*"]}, spec("read"), ("ask", "listed in tools.ask")),
        (
            {"allow": ["read"], "ask": ["read"], "deny": ["read"]},
            spec("read"),
            ("deny", "denied by tools.deny"),
        ),
        ({"allow": ["*"], "deny": ["*"]}, spec("read"), ("deny", "denied by tools.deny")),
        (
            {"allow": ["write"], "trustedPreHandlerTools": []},
            spec("write", Effect.WRITE),
            ("ask", "write effect needs approval"),
        ),
        (
            {"allow": ["write"], "trustedPreHandlerTools": ["write"]},
            spec("write", Effect.WRITE),
            ("allow", "allowed write tool, trusted by tools.trustedPreHandlerTools"),
        ),
        (
            {"allow": ["pay"], "trustedPreHandlerTools": []},
            spec("pay", Effect.EXTERNAL),
            ("ask", "external effect needs approval"),
        ),
        (
            {"allow": ["pay"], "trustedPreHandlerTools": ["pay"]},
            spec("pay", Effect.EXTERNAL),
            ("allow", "allowed external tool, trusted by tools.trustedPreHandlerTools"),
        ),
        (
            {"allow": ["web_search"], "trustedPreHandlerTools": ["web_search"]},
            spec("web_search", enforceable=False),
            ("deny", "unenforceable: blocked at source"),
        ),
        (
            {"allow": ["read"], "trustedPreHandlerTools": [], "effects": {"read": "write"}},
            spec("read"),
            ("ask", "write effect needs approval"),
        ),
    ],
)
def test_the_first_rule_that_applies_decides(
    tools: dict[str, Any], tool: ToolSpec, expected: tuple[str, str]
) -> None:
    assert outcome(tools, tool) == expected


def test_settings_can_raise_a_tools_effect_but_never_lower_it() -> None:
    plan = plan_tools(
        compiled(
            {
                "allow": ["*"],
                "trustedPreHandlerTools": [],
                "effects": {"a": "external", "b": "read"},
            }
        ),
        [spec("a", Effect.WRITE), spec("b", Effect.WRITE)],
    )
    assert [(t.effect, t.decision) for t in plan.tools] == [
        (Effect.EXTERNAL, Decision.ASK),
        (Effect.WRITE, Decision.ASK),
    ]


def test_effects_map_to_the_trust_tiers_read_write_and_high_risk() -> None:
    plan = plan_tools(
        compiled({"allow": ["*"]}),
        [spec("r"), spec("w", Effect.WRITE), spec("x", Effect.EXTERNAL)],
    )
    assert [t.tier for t in plan.tools] == ["read", "write", "high-risk"]


def test_offered_keeps_allowed_and_asked_tools_in_their_order() -> None:
    tools = [spec("a"), spec("gone"), spec("w", Effect.WRITE), spec("maybe")]
    plan = plan_tools(compiled({"allow": ["a", "w"], "deny": ["gone"]}), tools)
    assert [t.name for t in plan.offered()] == ["a", "w", "maybe"]
    assert plan.decision("a") is Decision.ALLOW
    assert plan.decision("w") is Decision.ASK
    assert plan.decision("gone") is Decision.DENY


def test_a_tool_the_plan_does_not_know_is_denied() -> None:
    plan = plan_tools(compiled({"allow": ["*"]}), [spec("a")])
    assert plan.decision("never-heard-of") is Decision.DENY


def test_duplicate_tool_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unique"):
        plan_tools(compiled({}), [spec("a"), spec("a")])


def test_the_plan_is_the_same_from_a_compilation_parsed_settings_or_a_snapshot_dict() -> None:
    result = compiled({"allow": ["a", "w"], "ask": ["q"], "trustedPreHandlerTools": ["w"]})
    tools = [spec("a"), spec("w", Effect.WRITE), spec("q"), spec("n", Effect.EXTERNAL)]
    expected = plan_tools(result, tools).as_list()
    assert plan_tools(result.settings, tools).as_list() == expected
    assert plan_tools(result.settings_dict(), tools).as_list() == expected


def test_as_list_gives_name_decision_reason_effect_and_tier() -> None:
    plan = plan_tools(compiled({"allow": ["a"]}), [spec("a")])
    assert plan.as_list() == [
        {
            "name": "a",
            "decision": "allow",
            "reason": "allowed read tool",
            "effect": "read",
            "tier": "read",
        }
    ]


def test_decisions_map_each_tool_to_its_decision_and_reason() -> None:
    plan = plan_tools(compiled({"allow": ["a"], "deny": ["d"]}), [spec("a"), spec("d"), spec("n")])
    assert plan.decisions() == {
        "a": ("allow", "allowed read tool"),
        "d": ("deny", "denied by tools.deny"),
        "n": ("ask", "not explicitly allowed"),
    }


def test_a_snapshot_pinned_before_a_schema_change_still_plans_from_its_tools_section() -> None:
    # A run stored before issue 18: memory on, connectors "*", no paths section. Only the tools
    # section is read, so the run plans exactly as it did when its snapshot was taken.
    current = compiled({"allow": ["read"], "deny": ["write"]}).settings_dict()
    old = {k: v for k, v in current.items() if k != "paths"}
    old["memory"] = {"enabled": True, "scopes": ["public"], "maxChars": 8000}
    old["isolation"] = {**old["isolation"], "allowedConnectors": ["*"]}
    old["isolation"].pop("allowedHosts")
    tools = [spec("read"), spec("write", Effect.WRITE), spec("bash", Effect.EXTERNAL)]
    assert plan_tools(old, tools).as_list() == plan_tools(current, tools).as_list()
    with pytest.raises(ValueError, match="allow"):
        plan_tools({**old, "tools": {**old["tools"], "allow": "read"}}, tools)

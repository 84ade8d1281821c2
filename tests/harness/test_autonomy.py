"""The registration check's core (harness/autonomy.py): which tools autonomy lets run ungated.

The save-time check (``ungated_tools``) and the call-time gate (``autonomy_gates``) must agree:
a property test derives the runtime's decisions the way the worker does (plan, then the
allowlist waives asks) and checks the gate changes exactly the tools the save-time check names.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.autonomy import (
    ALLOWLISTED,
    TRUSTED,
    autonomy_gates,
    gate_reason,
    needs_gate,
    plan_effects,
    ungated_tools,
)
from harness.planner import ToolPlan, plan_tools
from runtime.policy import decision_of
from runtime.types import Effect, ToolSpec

NAMES = ["read", "write", "edit", "bash", "fetch", "skill_hub_x"]
LEVELS = ["L1", "L2", "L3"]


def spec(name: str, effect: Effect, enforceable: bool = True) -> ToolSpec:
    return ToolSpec(
        name=name,
        description="",
        parameters={"type": "object"},
        effect=effect,
        enforceable=enforceable,
    )


def settings_of(allow: Any = "*", ask: Any = (), deny: Any = (), trusted: Any = ()) -> Any:
    def names(value: Any) -> list[str]:
        return ["*"] if value == "*" else list(value)

    return {
        "tools": {
            "allow": names(allow),
            "ask": names(ask),
            "deny": names(deny),
            "effects": {},
            "trustedPreHandlerTools": names(trusted),
        }
    }


def runtime_decisions(plan: ToolPlan, allowlist: list[str]) -> dict[str, Any]:
    """What loops/worker/invoker.py role_tool_policy builds before the autonomy gate."""
    decisions: dict[str, Any] = plan.decisions()
    for name in allowlist:
        if name in decisions and decision_of(decisions[name]) == "ask":
            decisions[name] = ("allow", "in the pattern's autoAllowlist")
    return decisions


TOOLS = [
    spec("read", Effect.READ),
    spec("write", Effect.WRITE),
    spec("bash", Effect.WRITE),
    spec("fetch", Effect.EXTERNAL),
]


def test_the_tiers_each_level_gates() -> None:
    assert [needs_gate(Effect.WRITE, lv) for lv in LEVELS] == [True, False, False]
    assert [needs_gate(Effect.EXTERNAL, lv) for lv in LEVELS] == [True, True, False]
    assert not any(needs_gate(Effect.READ, lv) for lv in LEVELS)
    # An unknown level fails closed: it gates like L1.
    assert needs_gate(Effect.WRITE, None) and needs_gate(Effect.WRITE, "L9")


def test_the_reason_names_the_level_and_the_tier() -> None:
    assert gate_reason(Effect.WRITE, "L1") == "autonomy L1 needs a human gate for write tools"
    assert gate_reason("external", "L2") == "autonomy L2 needs a human gate for high-risk tools"
    assert gate_reason(Effect.WRITE, "") == "autonomy L1 needs a human gate for write tools"


def test_trusted_write_tools_are_ungated_violations_at_l1_only() -> None:
    plan = plan_tools(settings_of(trusted=["write", "fetch"]), TOOLS)
    found = ungated_tools(plan, "L1")
    assert [(t.name, t.tier, t.sources) for t in found] == [
        ("write", "write", (TRUSTED,)),
        ("fetch", "high-risk", (TRUSTED,)),
    ]
    assert found[0].reason == "autonomy L1 needs a human gate for write tools"
    assert [t.name for t in ungated_tools(plan, "L2")] == ["fetch"]
    assert ungated_tools(plan, "L3") == []


def test_the_allowlist_waives_an_ask_but_never_a_deny_nor_a_review_gate() -> None:
    plan = plan_tools(settings_of(deny=["bash"]), TOOLS)  # write, fetch ask; bash denied
    found = ungated_tools(
        plan, "L1", auto_allowlist=["write", "bash", "fetch", "read"], review_gated=["fetch"]
    )
    assert [(t.name, t.sources) for t in found] == [("write", (ALLOWLISTED,))]


def test_a_tool_both_trusted_and_allowlisted_names_both_sources() -> None:
    plan = plan_tools(settings_of(trusted=["write"]), TOOLS)
    (found,) = ungated_tools(plan, "L1", auto_allowlist=["write"])
    assert found.sources == (TRUSTED, ALLOWLISTED)


def test_raised_effects_count_a_read_tool_raised_to_external_is_high_risk() -> None:
    raised = settings_of()
    raised["tools"]["effects"] = {"read": "external"}
    plan = plan_tools(raised, TOOLS)
    assert [t.name for t in ungated_tools(plan, "L2", auto_allowlist=["read"])] == ["read"]


def test_the_gate_turns_a_forbidden_allow_into_ask_and_keeps_everything_else() -> None:
    plan = plan_tools(settings_of(trusted=["write", "fetch"], deny=["bash"]), TOOLS)
    gated = autonomy_gates(plan.decisions(), plan_effects(plan), "L1")
    assert gated == {
        "read": ("allow", "allowed read tool"),
        "write": ("ask", "autonomy L1 needs a human gate for write tools"),
        "bash": ("deny", "denied by tools.deny"),
        "fetch": ("ask", "autonomy L1 needs a human gate for high-risk tools"),
    }
    at_l2 = autonomy_gates(plan.decisions(), plan_effects(plan), "L2")
    assert at_l2["write"][0] == "allow" and at_l2["fetch"][0] == "ask"
    assert autonomy_gates(plan.decisions(), plan_effects(plan), "L3") == plan.decisions()


def test_a_bare_decision_and_an_unknown_effect_are_handled_fail_closed() -> None:
    gated = autonomy_gates({"mystery": "allow", "read": "allow"}, {"read": "read"}, "L1")
    assert gated == {
        "mystery": ("ask", "autonomy L1 needs a human gate for write tools"),
        "read": "allow",
    }


_effects = st.sampled_from(list(Effect))
_subsets = st.lists(st.sampled_from(NAMES), unique=True)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[ToolPlan, list[str], str]:
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, min_size=1))
    tools = [spec(n, draw(_effects), draw(st.booleans() | st.just(True))) for n in names]
    allow = draw(st.just("*") | _subsets)
    plan = plan_tools(
        settings_of(allow=allow, ask=draw(_subsets), deny=draw(_subsets), trusted=draw(_subsets)),
        tools,
    )
    return plan, draw(_subsets), draw(st.sampled_from([*LEVELS, "", "L7"]))


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_the_call_time_gate_changes_exactly_what_the_save_time_check_names(
    scenario: tuple[ToolPlan, list[str], str],
) -> None:
    plan, allowlist, level = scenario
    decisions = runtime_decisions(plan, allowlist)
    gated = autonomy_gates(decisions, plan_effects(plan), level)
    changed = {name for name in decisions if gated[name] != decisions[name]}
    assert changed == {t.name for t in ungated_tools(plan, level, auto_allowlist=allowlist)}
    for name, value in gated.items():
        # Nothing ungated is left that the level forbids; ask and deny never change.
        if decision_of(value) == "allow":
            assert not needs_gate(plan.by_name[name].effect, level)
        if decision_of(decisions[name]) != "allow":
            assert gated[name] == decisions[name]
        else:
            assert decision_of(value) in ("allow", "ask")


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_a_higher_level_never_gates_more(scenario: tuple[ToolPlan, list[str], str]) -> None:
    plan, allowlist, _ = scenario
    found = [{t.name for t in ungated_tools(plan, lv, auto_allowlist=allowlist)} for lv in LEVELS]
    assert found[0] >= found[1] >= found[2] == set()

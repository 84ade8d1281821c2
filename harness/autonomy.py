"""The registration check of seed 004: which tools autonomy lets run without a human gate. Pure.

Tools are in trust tiers (``read``, ``write``, ``high-risk`` = the ``external`` effect). The
pattern's autonomy level decides which tiers may run *ungated*:

- ``L1`` (supervised): no write or high-risk tool runs without a human gate;
- ``L2``: write tools may run ungated (the run edits its own worktree and a human accepts the
  result), high-risk tools need a gate;
- ``L3`` (autonomous): whatever the harness trusts.

A tool is ungated when the role's tool plan allows it (a write or external tool the compiled
``tools.trustedPreHandlerTools`` trusts) or when the pattern's ``approvals.autoAllowlist`` waives
the ``ask`` the plan gave it. Review gates of tool providers (Skill Hub skills that require
review) always ask, so they never count.

The same rule binds twice: when a pattern is saved or a profile is published
(:func:`ungated_tools`, called by ``loops.services.patterns``), and where the call happens
(:func:`autonomy_gates`, applied to the decisions of ``role_tool_policy`` in the worker), so a
snapshot or an allowlist that predates the check still cannot run a forbidden tool ungated.
An unknown level is treated as ``L1``: the check fails closed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.planner import TRUST_TIERS, ToolPlan
from runtime.policy import Decision, decision_of
from runtime.types import Effect

LEVELS: tuple[str, ...] = ("L1", "L2", "L3")

#: The effects that need a human gate at each level.
GATED_EFFECTS: dict[str, frozenset[Effect]] = {
    "L1": frozenset({Effect.WRITE, Effect.EXTERNAL}),
    "L2": frozenset({Effect.EXTERNAL}),
    "L3": frozenset(),
}

TRUSTED = "trusted"
"""Ungated because the plan allows it (``tools.trustedPreHandlerTools``)."""
ALLOWLISTED = "autoAllowlist"
"""Ungated because the pattern's ``approvals.autoAllowlist`` waives its ``ask``."""


def level_of(level: str | None) -> str:
    """The level as a known name; anything else is ``L1`` (fail closed)."""
    return level if level in GATED_EFFECTS else "L1"


def _effect(value: Effect | str) -> Effect:
    return value if isinstance(value, Effect) else Effect(str(value))


def needs_gate(effect: Effect | str, level: str | None) -> bool:
    """Whether a tool of ``effect`` needs a human gate at ``level``."""
    return _effect(effect) in GATED_EFFECTS[level_of(level)]


def gate_reason(effect: Effect | str, level: str | None) -> str:
    """``autonomy L1 needs a human gate for write tools`` (the tier's name: write, high-risk)."""
    return f"autonomy {level_of(level)} needs a human gate for {TRUST_TIERS[_effect(effect)]} tools"


@dataclass(frozen=True)
class UngatedTool:
    """A tool that would run without a human gate although the autonomy level forbids it."""

    name: str
    effect: Effect
    #: Why it is ungated: :data:`TRUSTED`, :data:`ALLOWLISTED`, or both (in that order).
    sources: tuple[str, ...]
    #: The plan's reason for its decision (``allowed write tool, trusted by ...``).
    plan_reason: str
    level: str

    @property
    def tier(self) -> str:
        return TRUST_TIERS[self.effect]

    @property
    def reason(self) -> str:
        return gate_reason(self.effect, self.level)


def ungated_tools(
    plan: ToolPlan,
    level: str | None,
    *,
    auto_allowlist: Iterable[str] = (),
    review_gated: Iterable[str] = (),
) -> list[UngatedTool]:
    """The violations of ``plan`` at ``level``: tools of a gated tier that run without a gate.

    ``auto_allowlist`` is the pattern's ``approvals.autoAllowlist`` (waives an ``ask``, never a
    ``deny``); ``review_gated`` names tools a provider always gates (never ungated). In the
    plan's order, one entry per tool.
    """
    known = level_of(level)
    allowlisted = frozenset(auto_allowlist)
    reviewed = frozenset(review_gated)
    found = []
    for planned in plan.tools:
        if planned.name in reviewed or not needs_gate(planned.effect, known):
            continue
        sources: tuple[str, ...] = ()
        if planned.decision is Decision.ALLOW:
            sources = (TRUSTED,)
        if planned.decision is not Decision.DENY and planned.name in allowlisted:
            sources = (*sources, ALLOWLISTED)
        if sources:
            found.append(UngatedTool(planned.name, planned.effect, sources, planned.reason, known))
    return found


def plan_effects(plan: ToolPlan) -> dict[str, Effect]:
    """``{name: effective effect}`` of a plan (the effect the tier check uses)."""
    return {planned.name: planned.effect for planned in plan.tools}


def autonomy_gates(
    decisions: Mapping[str, Any], effects: Mapping[str, Effect | str], level: str | None
) -> dict[str, Any]:
    """``decisions`` with every ``allow`` that ``level`` forbids turned into ``ask``.

    ``decisions`` is ``{name: (decision, reason)}`` (or bare decisions) after the pattern's
    autoAllowlist was applied; ``effects`` the plan's effective effects (:func:`plan_effects`).
    A tool without a known effect is treated as write-tier. The reason names the rule:
    ``autonomy L1 needs a human gate for write tools``. ``ask`` and ``deny`` are kept.
    """
    gated = dict(decisions)
    for name, value in decisions.items():
        if decision_of(value) != Decision.ALLOW.value:
            continue
        effect = effects.get(name, Effect.WRITE)
        if needs_gate(effect, level):
            gated[name] = (Decision.ASK.value, gate_reason(effect, level))
    return gated

"""The tool plan: what each tool may do under compiled harness settings. Pure.

Rules, in order (the first that applies decides):

1. a tool whose policy Loopwright cannot enforce is blocked at the source (deny); so is
   ``dispatch_sub_agent_task`` while the ``delegation`` section allows no sub-agent
   (``maxDepth`` or ``maxCount`` 0, or no ``allowedEmployees``), and a connector's tool
   (``mcp__<server>__<tool>``, ``a2a__<agent>``) whose connector ``isolation.allowedConnectors``
   does not list;
2. listed in ``tools.deny`` → deny;
3. listed in ``tools.ask`` → ask;
4. not in ``tools.allow`` → ask (never silently allowed, never silently dropped);
5. allowed with a read effect → allow;
6. allowed with a write or external effect → allow only when in ``tools.trustedPreHandlerTools``,
   else ask.

The effective effect of a tool is the more severe of the effect its spec declares and the one
``tools.effects`` gives it. Effects are trust tiers: read (no gate), write (a human gate unless
trusted), external = high-risk (gated, and run under the pattern's own identity).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from harness.compile import CompiledHarness, name_set
from harness.schema import (
    EFFECTS,
    WILDCARD,
    DelegationSettings,
    HarnessSettings,
    ToolsSettings,
)
from runtime.policy import Decision
from runtime.tools.subagents import SUB_AGENT_TOOL
from runtime.types import Effect, ToolSpec

TRUST_TIERS: dict[Effect, str] = {
    Effect.READ: "read",
    Effect.WRITE: "write",
    Effect.EXTERNAL: "high-risk",
}
_SEVERITY = {effect: rank for rank, effect in enumerate(EFFECTS)}


@dataclass(frozen=True, slots=True)
class ToolSets:
    """The tools section as sets, where ``"*"`` stands for every name."""

    allow: frozenset[str]
    ask: frozenset[str]
    deny: frozenset[str]
    effects: Mapping[str, str]
    trusted: frozenset[str]
    #: Why the delegation section allows no sub-agent ("" when it allows some).
    delegation_off: str = ""
    #: ``isolation.allowedConnectors`` (empty: no connector's tools).
    connectors: frozenset[str] = frozenset()

    @classmethod
    def of(cls, settings: CompiledHarness | HarnessSettings | Mapping[str, Any]) -> ToolSets:
        """From a compilation, parsed settings, or a snapshot's settings dict (validated)."""
        if isinstance(settings, CompiledHarness):
            values = settings.values
            return cls(
                allow=values["tools.allow"],
                ask=values["tools.ask"],
                deny=values["tools.deny"],
                effects=values["tools.effects"],
                trusted=values["tools.trustedPreHandlerTools"],
                delegation_off=_delegation_off(
                    values["delegation.allowedEmployees"],
                    values["delegation.maxDepth"],
                    values["delegation.maxCount"],
                ),
                connectors=values["isolation.allowedConnectors"],
            )
        delegation: DelegationSettings | None
        connectors: list[str]
        if isinstance(settings, HarnessSettings):
            tools, delegation = settings.tools, settings.delegation
            connectors = settings.isolation.allowed_connectors
        else:
            # Only the sections the plan reads: a snapshot pinned before a later schema change
            # (another section added or narrowed) still plans exactly as it did when compiled.
            tools = ToolsSettings.model_validate(settings["tools"])
            stated = settings.get("delegation")
            delegation = None if stated is None else DelegationSettings.model_validate(stated)
            connectors = _connectors_of(settings.get("isolation"))
        return cls(
            allow=name_set(tools.allow),
            ask=name_set(tools.ask),
            deny=name_set(tools.deny),
            effects=tools.effects,
            trusted=name_set(tools.trusted_pre_handler_tools),
            delegation_off=(
                "the snapshot has no delegation section"
                if delegation is None
                else _delegation_off(
                    name_set(delegation.allowed_employees),
                    delegation.max_depth,
                    delegation.max_count,
                )
            ),
            connectors=name_set(connectors),
        )


def _connectors_of(isolation: Any) -> list[str]:
    """A snapshot's ``isolation.allowedConnectors`` (a snapshot without it allows none)."""
    names = isolation.get("allowedConnectors") if isinstance(isolation, Mapping) else None
    return [str(n) for n in names] if isinstance(names, list) else []


def connector_of(name: str) -> str | None:
    """The connector a tool belongs to: ``<server>`` of ``mcp__<server>__<tool>``, ``<agent>``
    of ``a2a__<agent>``; else None."""
    if name.startswith(A2A_PREFIX):
        agent = name[len(A2A_PREFIX) :]
        return agent if agent and "__" not in agent else None
    if not name.startswith(MCP_PREFIX):
        return None
    server, sep, tool = name[len(MCP_PREFIX) :].partition("__")
    return server if sep and server and tool else None


def _delegation_off(allowed: frozenset[str], depth: int, count: int) -> str:
    """Why no sub-agent may run under these delegation values ("" when some may)."""
    if depth < 1:
        return "delegation.maxDepth = 0"
    if count < 1:
        return "delegation.maxCount = 0"
    if not allowed:
        return "delegation.allowedEmployees = []"
    return ""


class PlannedTool(NamedTuple):
    """One tool's decision (a tuple: planning 200 tools must stay far below a millisecond)."""

    spec: ToolSpec
    decision: Decision
    reason: str
    effect: Effect

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def tier(self) -> str:
        return TRUST_TIERS[self.effect]

    def as_dict(self) -> dict[str, str]:
        return {
            "name": self.spec.name,
            "decision": self.decision.value,
            "reason": self.reason,
            "effect": self.effect.value,
            "tier": self.tier,
        }


@dataclass(frozen=True)
class ToolPlan:
    """Decisions for a toolset, in the order the tools were given."""

    tools: tuple[PlannedTool, ...]
    by_name: Mapping[str, PlannedTool]

    def offered(self) -> list[ToolSpec]:
        """Tools to attach to the model: allowed ones and those that stop for approval."""
        return [t.spec for t in self.tools if t.decision is not Decision.DENY]

    def decision(self, name: str) -> Decision:
        """The decision for a tool; a name the plan does not know is denied (fail closed)."""
        planned = self.by_name.get(name)
        return planned.decision if planned is not None else Decision.DENY

    def as_list(self) -> list[dict[str, str]]:
        return [t.as_dict() for t in self.tools]

    def decisions(self) -> dict[str, tuple[str, str]]:
        """``{name: (decision, reason)}``: the runtime's ``ToolPolicy.from_decisions`` input."""
        return {t.spec.name: (t.decision.value, t.reason) for t in self.tools}


_EFFECTS_BY_NAME = {effect.value: effect for effect in Effect}
#: Tools of MCP servers are named ``mcp__<server>__<tool>`` (connectors/naming.py).
MCP_PREFIX = "mcp__"
#: External A2A agents are offered as ``a2a__<agent>`` (connectors/a2a_tools.py).
A2A_PREFIX = "a2a__"
_CONNECTOR_PREFIXES = (MCP_PREFIX, A2A_PREFIX)
_READ = Effect.READ
# Outcomes are built once: enum attribute lookups would dominate planning 200 tools.
Outcome = tuple[Decision, str]
_BLOCKED: Outcome = (Decision.DENY, "unenforceable: blocked at source")
_DENIED: Outcome = (Decision.DENY, "denied by tools.deny")
_ASKED: Outcome = (Decision.ASK, "listed in tools.ask")
_NOT_ALLOWED: Outcome = (Decision.ASK, "not explicitly allowed")
_READ_ALLOWED: Outcome = (Decision.ALLOW, "allowed read tool")
_TRUSTED: dict[Effect, Outcome] = {
    e: (Decision.ALLOW, f"allowed {e.value} tool, trusted by tools.trustedPreHandlerTools")
    for e in Effect
}
_NEEDS_APPROVAL: dict[Effect, Outcome] = {
    e: (Decision.ASK, f"{e.value} effect needs approval") for e in Effect
}


def _listed(name: str, names: frozenset[str]) -> bool:
    return name in names or WILDCARD in names


def _effective_effect(spec: ToolSpec, effects: Mapping[str, str]) -> Effect:
    stated = effects.get(spec.name)
    if stated is None or _SEVERITY[stated] <= _SEVERITY[spec.effect]:
        return spec.effect
    return _EFFECTS_BY_NAME[stated]


def _decide(spec: ToolSpec, effect: Effect, policy: ToolSets) -> Outcome:
    name = spec.name
    if not spec.enforceable:
        return _BLOCKED
    if name == SUB_AGENT_TOOL and policy.delegation_off:
        return (Decision.DENY, f"no sub-agent may run: {policy.delegation_off}")
    if name.startswith(_CONNECTOR_PREFIXES):
        connector = connector_of(name)
        if connector is None or not _listed(connector, policy.connectors):
            return (Decision.DENY, f"connector {connector} not in isolation.allowedConnectors")
    if _listed(name, policy.deny):
        return _DENIED
    if _listed(name, policy.ask):
        return _ASKED
    if not _listed(name, policy.allow):
        return _NOT_ALLOWED
    if effect is _READ:
        return _READ_ALLOWED
    if _listed(name, policy.trusted):
        return _TRUSTED[effect]
    return _NEEDS_APPROVAL[effect]


def plan_tools(
    settings: CompiledHarness | HarnessSettings | Mapping[str, Any], tools: Sequence[ToolSpec]
) -> ToolPlan:
    """Decide allow / ask / deny for every tool; raises ValueError on duplicate tool names."""
    policy = ToolSets.of(settings)
    planned = []
    for spec in tools:
        effect = _effective_effect(spec, policy.effects)
        decision, reason = _decide(spec, effect, policy)
        planned.append(PlannedTool(spec, decision, reason, effect))
    by_name = {t.spec.name: t for t in planned}
    if len(by_name) != len(planned):
        raise ValueError("tool names must be unique within a toolset")
    return ToolPlan(tuple(planned), by_name)

"""The tool policy one invocation runs under: which tools are offered and which are gated.

The harness planner (``harness/planner.py``) decides this from the compiled harness snapshot;
the loop only consumes the result, as a :class:`ToolPolicy`. A tool the policy does not name is
treated as denied: nothing outside the plan is offered or executed.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from runtime.types import ToolSpec


class Decision(enum.StrEnum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


def decision_of(value: object) -> str:
    """A plan entry's decision: ``"ask"`` of ``("ask", "reason")``, a bare ``"allow"`` as is."""
    return str(value[0] if isinstance(value, tuple) else value)


@dataclass(frozen=True)
class ToolRule:
    decision: Decision
    reason: str = ""


_NOT_IN_PLAN = ToolRule(Decision.DENY, "not in this invocation's tool plan")


@dataclass(frozen=True)
class ToolPolicy:
    """Tool name → decision (allow / ask / deny) with the reason the plan gives."""

    rules: Mapping[str, ToolRule] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_decisions(cls, decisions: Mapping[str, str | tuple[str, str]]) -> ToolPolicy:
        """``{"read": "allow", "write": ("ask", "writes need a human")}`` → a policy."""
        rules = {}
        for name, value in decisions.items():
            decision, reason = (value, "") if isinstance(value, str) else value
            rules[name] = ToolRule(Decision(decision), reason)
        return cls(MappingProxyType(rules))

    def rule(self, tool: str) -> ToolRule:
        return self.rules.get(tool, _NOT_IN_PLAN)

    def offers(self, tool: str) -> bool:
        return self.rule(tool).decision is not Decision.DENY


_NO_WORKDIR = ToolRule(Decision.DENY, "it needs a working directory, which this invocation lacks")


def without_workdir_tools(policy: ToolPolicy, specs: Iterable[ToolSpec]) -> ToolPolicy:
    """``policy`` with the tools of ``specs`` that need a working directory refused, for an
    invocation that has none (a request at the OpenAI-compatible endpoint, its sub-agents)."""
    rules = dict(policy.rules)
    for spec in specs:
        if spec.needs_workdir and policy.offers(spec.name):
            rules[spec.name] = _NO_WORKDIR
    return ToolPolicy(MappingProxyType(rules))

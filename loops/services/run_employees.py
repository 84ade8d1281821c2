"""What a run reads of its employees when it starts: one statement for its harness layers and
its instruction pins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Q

from orchestrator.agents.models import Employee, SubAgentBinding


@dataclass(frozen=True)
class RunEmployees:
    """``layers``: username → (harness_tag, inline harness) of the role employees that carry
    any; ``prompts``: the system prompts of the role employees and their sub-agents."""

    layers: dict[str, tuple[str, dict[str, Any]]]
    prompts: list[str]


def run_employees_read(usernames: list[str]) -> RunEmployees:
    """The employees ``usernames`` (and their sub-agents' prompts), in one query."""
    children = SubAgentBinding.objects.filter(parent__username__in=usernames).values("child")
    rows = list(
        Employee.objects.filter(Q(username__in=usernames) | Q(pk__in=children)).values_list(
            "username", "harness_tag", "harness", "system_prompt"
        )
    )
    roles = set(usernames)
    layers = {
        name: (tag, harness or {})
        for name, tag, harness, _ in rows
        if name in roles and (tag or harness)
    }
    return RunEmployees(layers, [prompt for *_, prompt in rows])

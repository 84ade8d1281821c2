"""Patterns whose goal template references an instruction, for ``instructions.usage``.

Patterns have no role prompts of their own (a role's prompt is its employee's system prompt,
found by ``orchestrator.agents.instruction_usage``), so the goal template is the one field.
"""

from __future__ import annotations

from django.urls import reverse

from instructions.usage import InstructionUsage, usages_in
from loops.models import LoopPattern


def pattern_instruction_uses(name: str) -> list[InstructionUsage]:
    """One use per pattern and pinned version whose ``goal_template`` references ``name``."""
    # The database narrows by substring; the reference grammar decides.
    candidates = LoopPattern.objects.filter(goal_template__contains=f"instructions.{name}")
    found: list[InstructionUsage] = []
    for key, template in candidates.order_by("key").values_list("key", "goal_template"):
        url = reverse("pattern-detail", kwargs={"key": key})
        found.extend(
            usages_in(template, name, kind="pattern", label=key, field="goal_template", url=url)
        )
    return found

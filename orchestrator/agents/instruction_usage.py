"""Employees whose system prompt references an instruction, for ``instructions.usage``."""

from __future__ import annotations

from django.urls import reverse

from instructions.usage import InstructionUsage, usages_in
from orchestrator.agents.models import Employee


def employee_instruction_uses(name: str) -> list[InstructionUsage]:
    """One use per employee and pinned version whose ``system_prompt`` references ``name``."""
    # The database narrows by substring; the reference grammar decides.
    candidates = Employee.objects.filter(system_prompt__contains=f"instructions.{name}")
    found: list[InstructionUsage] = []
    for username, prompt in candidates.order_by("username").values_list(
        "username", "system_prompt"
    ):
        url = reverse("employee-detail", kwargs={"username": username})
        found.extend(
            usages_in(prompt, name, kind="employee", label=username, field="system_prompt", url=url)
        )
    return found

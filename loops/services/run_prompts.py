"""The instruction versions a run is pinned to, and its goal with its instructions in.

When a run starts, every instruction its pattern's goal template and its employees' system
prompts (sub-agents included) reference without a version is fixed at its latest published
version (``LoopRun.instruction_versions``); a retry keeps the versions of the run it retries.
A reference that cannot be resolved refuses the trigger (400) before anything runs.
"""

from __future__ import annotations

from typing import Any

from instructions.rendering import pins_for, published_text
from loops.models import LoopPattern, LoopRun
from loops.templates import render_goal
from orchestrator.errors import InvalidInput
from runtime.prompt_template import PromptTemplateError, substitute_instructions

_TEXTS = "__lw_instructions__"


def _refused(exc: PromptTemplateError, pointer: str) -> InvalidInput:
    problem = {"pointer": pointer, "detail": str(exc), "code": "instruction_reference"}
    return InvalidInput(f"The run cannot start: {exc}.", errors=[problem])


def run_instruction_pins(
    pattern: LoopPattern, prompts: list[str], retry_of: LoopRun | None = None
) -> dict[str, int]:
    """``{name: version}`` for the run's unversioned instruction references: its goal
    template's and its employees' system prompts' (``RunEmployees.prompts``)."""
    try:
        pins = pins_for([pattern.goal_template, *prompts])
    except PromptTemplateError as exc:
        raise _refused(exc, "/goal_template") from exc
    if retry_of is not None:
        pins.update({k: int(v) for k, v in (retry_of.instruction_versions or {}).items()})
    return pins


def run_goal(pattern: LoopPattern, context: dict[str, Any], pins: dict[str, int]) -> str:
    """The goal template rendered with its instructions' pinned texts (inserted as text, never
    rendered as a template)."""
    try:
        template, texts, _ = substitute_instructions(
            pattern.goal_template, published_text, pins, lambda i: f"{{{{ {_TEXTS}[{i}] }}}}"
        )
    except PromptTemplateError as exc:
        raise _refused(exc, "/goal_template") from exc
    return render_goal(template, {**context, _TEXTS: texts})

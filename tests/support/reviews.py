"""A reviewed skill for the review-flow tests (docs/approvals.md): its arguments have an
interaction schema, every agent call of it waits for a person, and deciding needs a review."""

from __future__ import annotations

from typing import Any

from skillhub.models import Skill, SkillLoopConfig
from skillhub.services.skills import skill_create
from skillhub.tools import SKILL_TOOLS

SKILL = "rev_add"
TOOL = f"skill_hub_{SKILL}"
PROMPT = "Check that the numbers are small."
PY_ADD = "print('sum:', {{a}} + {{b}})\n"
NUMBERS = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer", "default": 1}},
    "required": ["a"],
    "additionalProperties": False,
}
INTERACTION = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "title": "First number", "minimum": 0, "maximum": 1000},
        "b": {"type": "integer", "title": "Second number"},
    },
    "required": ["a"],
}
REVIEW_SCHEMA = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["ok", "risky"], "title": "Verdict"},
        "comment": {"type": "string", "maxLength": 200, "title": "Comment"},
        "checks": {
            "type": "array",
            "title": "Checked",
            "items": {"type": "string", "enum": ["inputs", "limits"]},
        },
    },
    "required": ["verdict"],
    "additionalProperties": False,
}


def reviewed_skill(**fields: Any) -> Skill:
    """``rev_add``: adds ``a`` and ``b`` (prints ``sum: <a+b>``), reviewed with
    :data:`REVIEW_SCHEMA`; the tool provider's cache is dropped so its spec is read again."""
    values: dict[str, Any] = {
        "title": "Reviewed add", "description": "Adds a and b", "code_template": PY_ADD,
        "language": "python", "input_schema": NUMBERS, "interaction_schema": INTERACTION,
        "timeout_seconds": 20,
    }  # fmt: skip
    values.update(fields)
    skill = skill_create(actor="test", tool_name=SKILL, **values)
    SkillLoopConfig.objects.create(
        skill=skill, requires_review=True, review_prompt=PROMPT, review_schema=REVIEW_SCHEMA
    )
    SKILL_TOOLS.invalidate()
    return skill

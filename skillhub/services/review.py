"""A skill's human review settings (skillLoopConfigs): whether every agent call of it waits for
a person, the prompt the approval carries, and the review schema (a JSON Schema object).

Holds: the settings are written in one statement (create or replace); a review schema that is
not a JSON object, or not a valid JSON Schema (Draft 2020-12), is refused naming the field.
Who may change them is the caller's business (operators, in the API and the UI).
"""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator, SchemaError

from orchestrator.errors import invalid_fields
from skillhub.models import Skill, SkillLoopConfig

#: The longest review prompt (it is put in the approval's reason).
MAX_PROMPT = 4000


def review_problems(review_prompt: str, review_schema: Any) -> list[dict[str, str]]:
    problems = []
    if len(review_prompt) > MAX_PROMPT:
        problems.append(
            {"pointer": "/review_prompt", "detail": f"At most {MAX_PROMPT} characters.",
             "code": "invalid"}
        )  # fmt: skip
    if review_schema is not None:
        if not isinstance(review_schema, dict):
            problems.append(
                {"pointer": "/review_schema", "detail": "Must be a JSON object (a JSON Schema).",
                 "code": "invalid"}
            )  # fmt: skip
        else:
            try:
                Draft202012Validator.check_schema(review_schema)
            except SchemaError as exc:
                problems.append(
                    {"pointer": "/review_schema", "detail": f"Not a JSON Schema: {exc.message}",
                     "code": "invalid"}
                )  # fmt: skip
    return problems


def skill_review_save(
    *, skill: Skill, requires_review: bool, review_prompt: str, review_schema: Any
) -> SkillLoopConfig:
    """Create or replace the skill's review settings."""
    problems = review_problems(review_prompt, review_schema)
    if problems:
        raise invalid_fields(problems)
    config, _ = SkillLoopConfig.objects.update_or_create(
        skill=skill,
        defaults={
            "requires_review": requires_review,
            "review_prompt": review_prompt,
            "review_schema": review_schema,
        },
    )
    return config

"""Goal templates, rendered in Jinja2's sandbox: no attribute access to Python internals, no
code execution, and an undefined name is an error rather than an empty string."""

from __future__ import annotations

from typing import Any

from jinja2 import StrictUndefined, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from orchestrator.errors import InvalidInput

_env = ImmutableSandboxedEnvironment(undefined=StrictUndefined, autoescape=False)
MAX_GOAL_CHARS = 20_000


def check_template(template: str) -> None:
    """Refuse a template that does not parse (when a pattern is saved)."""
    try:
        _env.parse(template)
    except TemplateError as exc:
        raise InvalidInput(
            f"goal_template does not parse: {exc}",
            errors=[{"pointer": "/goal_template", "detail": str(exc), "code": "template_syntax"}],
        ) from exc


def render_goal(template: str, context: dict[str, Any]) -> str:
    """Render a goal; missing variables and sandbox violations become a 400 naming the cause."""
    try:
        text = _env.from_string(template).render(**context)
    except TemplateError as exc:
        raise InvalidInput(
            f"The goal template could not be rendered: {exc}",
            errors=[{"pointer": "/inputs", "detail": str(exc), "code": "template_render"}],
        ) from exc
    if len(text) > MAX_GOAL_CHARS:
        raise InvalidInput(f"The rendered goal is longer than {MAX_GOAL_CHARS} characters.")
    return text

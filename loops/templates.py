"""Goal templates, rendered in Jinja2's sandbox: no attribute access to Python internals, no
code execution, and an undefined name is an error rather than an empty string."""

from __future__ import annotations

import functools
from typing import Any

from jinja2 import StrictUndefined, Template, TemplateError, nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from orchestrator.errors import InvalidInput

_env = ImmutableSandboxedEnvironment(undefined=StrictUndefined, autoescape=False)
MAX_GOAL_CHARS = 20_000


def check_template(template: str) -> None:
    """Refuse, when a pattern is saved, a template longer than a rendered goal may be (every
    trigger would fail) or one that does not parse."""
    if len(template) > MAX_GOAL_CHARS:
        raise InvalidInput(
            f"goal_template is {len(template)} characters long; the limit is {MAX_GOAL_CHARS}, "
            "the longest goal a run accepts.",
            errors=[
                {
                    "pointer": "/goal_template",
                    "detail": f"Ensure this field has no more than {MAX_GOAL_CHARS} characters.",
                    "code": "max_length",
                    "max_length": MAX_GOAL_CHARS,
                }
            ],
        )
    try:
        _env.parse(template)
    except TemplateError as exc:
        raise InvalidInput(
            f"goal_template does not parse: {exc}",
            errors=[{"pointer": "/goal_template", "detail": str(exc), "code": "template_syntax"}],
        ) from exc


@functools.lru_cache(maxsize=256)
def _compiled(template: str) -> Template:
    """A template's compiled form, by its text (immutable and safe to render from any thread:
    a trigger does not parse and compile its pattern's template again)."""
    return _env.from_string(template)


def render_goal(template: str, context: dict[str, Any]) -> str:
    """Render a goal; missing variables and sandbox violations become a 400 naming the cause."""
    try:
        text = _compiled(template).render(**context)
    except TemplateError as exc:
        raise InvalidInput(
            f"The goal template could not be rendered: {exc}",
            errors=[{"pointer": "/inputs", "detail": str(exc), "code": "template_render"}],
        ) from exc
    if len(text) > MAX_GOAL_CHARS:
        raise InvalidInput(f"The rendered goal is longer than {MAX_GOAL_CHARS} characters.")
    return text


def _is_inputs(node: nodes.Node) -> bool:
    return isinstance(node, nodes.Name) and node.name == "inputs"


def template_inputs(template: str) -> list[str]:
    """The input names a goal template reads (``inputs.x``, ``inputs['x']``,
    ``inputs.get('x')``), sorted; [] for a template that does not parse."""
    try:
        tree = _env.parse(template)
    except TemplateError:
        return []
    found: set[str] = set()
    methods: set[int] = set()  # ``inputs.get(...)``, ``inputs.items()``: calls, not names
    for call in tree.find_all(nodes.Call):
        target = call.node
        if isinstance(target, nodes.Getattr) and _is_inputs(target.node):
            methods.add(id(target))
            if target.attr == "get" and call.args and isinstance(call.args[0], nodes.Const):
                found.add(str(call.args[0].value))
    for node in tree.find_all(nodes.Getattr):
        if _is_inputs(node.node) and id(node) not in methods:
            found.add(node.attr)
    for item in tree.find_all(nodes.Getitem):
        if _is_inputs(item.node) and isinstance(item.arg, nodes.Const):
            found.add(str(item.arg.value))
    return sorted(found)

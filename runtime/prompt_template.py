"""Prompt templates: ``${...}`` placeholders in system prompts, goal templates and role prompts.

Three kinds of placeholder, rendered in Jinja2's immutable sandbox (no access to Python
internals, an undefined name is an error, never an empty string):

* ``${instructions.NAME}`` / ``${instructions.NAME@3}``: a registered instruction's text, the
  latest published version or the one named. The text is inserted as is (never rendered again),
  and every version used is reported, so a run can pin it.
* ``${include("path")}``: a file of the run's workspace, read by the caller's reader.
* ``${name}`` / ``${inputs.name}``: the run's inputs (any Jinja expression over them).

``$${`` is a literal ``${`` (a shell snippet's ``$${HOME}`` stays ``${HOME}``).

A text without ``${`` is returned unchanged. Every failure is a :class:`PromptTemplateError`
naming the placeholder or the path, raised before any model call.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jinja2 import StrictUndefined, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

#: A valid instruction name (lower-case letters, digits, ``-`` and ``_``; a letter or digit first).
INSTRUCTION_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,99}")
_REFERENCE = re.compile(r"\$\{\s*instructions\.([a-z0-9][a-z0-9_-]{0,99})(?:@(\d{1,9}))?\s*\}")
#: The longest rendered prompt (characters).
MAX_PROMPT_CHARS = 200_000
_PINNED = "__lw_instructions__"
_LITERAL = '${"${"}'

# ``${`` ``}`` for expressions; blocks and comments get delimiters no prompt contains, so
# ``{{``, ``{%`` and ``{#`` in a prompt stay text.
_env = ImmutableSandboxedEnvironment(
    undefined=StrictUndefined,
    autoescape=False,
    variable_start_string="${",
    variable_end_string="}",
    block_start_string="\x00{%",
    block_end_string="%}\x00",
    comment_start_string="\x00{#",
    comment_end_string="#}\x00",
    keep_trailing_newline=True,
)

InstructionLookup = Callable[[str, "int | None"], tuple[str, int]]
IncludeReader = Callable[[str], str]


class PromptTemplateError(ValueError):
    """A placeholder could not be rendered; the message names it (and the path or version)."""


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    #: ``{name: version}`` of every instruction the text used.
    instructions: dict[str, int] = field(default_factory=dict)


def instruction_references(text: str) -> list[tuple[str, int | None]]:
    """The ``(name, version or None)`` of every instruction reference, in order, repeats kept."""
    return [(m[1], int(m[2]) if m[2] else None) for m in _REFERENCE.finditer(text or "")]


def has_placeholders(text: str) -> bool:
    return "${" in (text or "")


def substitute_instructions(
    text: str,
    instruction: InstructionLookup | None,
    pinned: Mapping[str, int] | None,
    placeholder: Callable[[int], str],
) -> tuple[str, list[str], dict[str, int]]:
    """``text`` with each instruction reference replaced by ``placeholder(i)``, the texts
    (``i``-th at index ``i``) and ``{name: version}`` used. An unversioned reference takes the
    version in ``pinned`` when there is one, else ``instruction(name, None)``'s."""
    used: dict[str, int] = {}
    texts: list[str] = []

    def substitute(match: re.Match[str]) -> str:
        name, version = match[1], int(match[2]) if match[2] else None
        if instruction is None:
            raise PromptTemplateError(f"${{instructions.{name}}}: no instructions here")
        wanted = version if version is not None else (pinned or {}).get(name)
        body, number = instruction(name, wanted)
        if version is None:
            used[name] = number
        else:
            used.setdefault(name, number)
        texts.append(body)
        return placeholder(len(texts) - 1)

    return _REFERENCE.sub(substitute, text), texts, used


def render_prompt(
    text: str,
    *,
    variables: Mapping[str, Any] | None = None,
    instruction: InstructionLookup | None = None,
    include: IncludeReader | None = None,
    pinned: Mapping[str, int] | None = None,
    max_chars: int = MAX_PROMPT_CHARS,
) -> RenderedPrompt:
    """``text`` with its placeholders replaced. An unversioned instruction reference uses the
    version in ``pinned`` when there is one (a run renders with the versions it started with),
    else ``instruction(name, None)``'s. ``include`` None: ``${include()}`` is an error."""
    if not has_placeholders(text):
        return RenderedPrompt(text)
    source, texts, used = substitute_instructions(
        text.replace("$${", _LITERAL),
        instruction,
        pinned,
        lambda index: "${" + f"{_PINNED}[{index}]" + "}",
    )

    def read(path: Any) -> str:
        if include is None:
            raise PromptTemplateError(f'${{include("{path}")}}: there is no workspace to read')
        if not isinstance(path, str) or not path:
            raise PromptTemplateError("${include(...)} takes a path (a string)")
        return include(path)

    values: dict[str, Any] = dict(variables or {})
    values.setdefault("inputs", dict(variables or {}))
    values["include"] = read
    values[_PINNED] = texts
    try:
        rendered = _env.from_string(source).render(values)
    except PromptTemplateError:
        raise
    except TemplateError as exc:
        raise PromptTemplateError(f"the prompt template could not be rendered: {exc}") from exc
    if len(rendered) > max_chars:
        raise PromptTemplateError(
            f"the rendered prompt is {len(rendered):,} characters long; the limit is {max_chars:,}"
        )
    return RenderedPrompt(rendered, used)


def check_prompt_template(text: str) -> None:
    """Refuse, when a prompt is saved, a template that does not parse."""
    if not has_placeholders(text):
        return
    try:
        _env.parse(_REFERENCE.sub("${''}", text.replace("$${", _LITERAL)))
    except TemplateError as exc:
        raise PromptTemplateError(f"the prompt template does not parse: {exc}") from exc

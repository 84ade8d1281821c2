"""Pure rendering of a skill's ``codeTemplate``: every ``{{placeholder}}`` becomes a literal.

A value is never pasted into the program as text. It is JSON-encoded, and the JSON text is put
into the program as a *string literal* that the program parses at run time:

* Python: ``__import__("json").loads("<json text, escaped>")``
* Node.js: ``JSON.parse("<json text, escaped>")``

The escaped JSON text is produced by ``json.dumps`` with ``ensure_ascii=True`` applied twice, so
it is pure ASCII with only ``\\"`` and ``\\\\`` escapes, a valid string literal in both
languages. An input such as ``"); import os; os.system("id") #`` therefore arrives in the
program as exactly that string. Placeholders are expressions: put them where the language
expects a value (``name = {{name}}``), not inside a string literal.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def placeholders(template: str) -> list[str]:
    """The placeholder names of a template, in order of first appearance."""
    seen: dict[str, None] = {}
    for match in PLACEHOLDER.finditer(template):
        seen.setdefault(match.group(1), None)
    return list(seen)


def literal(language: str, value: Any) -> str:
    """``value`` as an expression of ``language`` that evaluates to the same JSON value."""
    quoted = json.dumps(json.dumps(value, ensure_ascii=True), ensure_ascii=True)
    if language == "python":
        return f'__import__("json").loads({quoted})'
    if language in ("node", "deno"):
        return f"JSON.parse({quoted})"
    raise ValueError(f"unsupported language {language!r}")


def render(template: str, language: str, values: Mapping[str, Any]) -> str:
    """Replace each placeholder by the literal of ``values[name]`` (None when absent)."""
    return PLACEHOLDER.sub(lambda m: literal(language, values.get(m.group(1))), template)


def with_defaults(schema: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The inputs plus the schema's top-level property defaults for what is missing."""
    merged = dict(inputs)
    properties = schema.get("properties") or {}
    if isinstance(properties, Mapping):
        for name, prop in properties.items():
            if name not in merged and isinstance(prop, Mapping) and "default" in prop:
                merged[name] = prop["default"]
    return merged

"""Bounds on JSON input: nesting depth, and only values both databases can store.

:func:`loads_bounded` parses like ``json.loads`` (whose C scanner turns a document nested past
the interpreter's recursion limit into ``RecursionError``, refused here) and then refuses a
document nested deeper than ``MAX_DEPTH`` levels, any string, key or value,
holding a NUL character or an unpaired surrogate (PostgreSQL refuses both) and any number that
is not finite. :func:`check_value` applies the same rules to an already parsed value.
:class:`JsonRefused` carries the JSON Pointer of the offending place. Pure Python, no Django.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_DEPTH = 64


class JsonRefused(ValueError):
    """JSON input refused: ``pointer`` names the place ("" for the whole document), ``code``
    is one of ``too_deep``, ``null_character``, ``unpaired_surrogate``, ``not_finite``,
    ``invalid_json``."""

    def __init__(self, detail: str, *, pointer: str = "", code: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.pointer = pointer
        self.code = code


def safe_text(text: str) -> str:
    """``text`` printable in a response: NUL and unpaired surrogates as escapes."""
    return text.replace("\x00", "\\u0000").encode("utf-8", "backslashreplace").decode("utf-8")


def pointer(path: list[str | int]) -> str:
    """RFC 6901 JSON Pointer of ``path`` (keys made printable with :func:`safe_text`)."""
    parts = (safe_text(str(p)).replace("~", "~0").replace("/", "~1") for p in path)
    return "".join("/" + part for part in parts)


def _string_problem(text: str) -> tuple[str, str] | None:
    if "\x00" in text:
        return "null_character", "contains a NUL character (\\u0000), which cannot be stored"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "unpaired_surrogate", "contains an unpaired UTF-16 surrogate, which is not text"
    return None


def _first_problem(value: Any, max_depth: int) -> JsonRefused | None:
    """The first refusal in ``value``, depth first; containers only are stacked."""
    if not isinstance(value, dict | list):
        return _scalar_problem(value, ())
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        node, path = stack.pop()
        if len(path) >= max_depth:
            return JsonRefused(
                f"JSON nested deeper than {max_depth} levels is not accepted.",
                pointer=pointer(list(path)),
                code="too_deep",
            )
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            here = (*path, key)
            if isinstance(key, str):
                problem = _string_problem(key)
                if problem is not None:
                    return _refusal("The key", here, problem)
            if isinstance(child, dict | list):
                stack.append((child, here))
            else:
                found = _scalar_problem(child, here)
                if found is not None:
                    return found
    return None


def _refusal(what: str, path: tuple[str | int, ...], problem: tuple[str, str]) -> JsonRefused:
    code, why = problem
    where = pointer(list(path))
    return JsonRefused(f"{what} at {where or '/'} {why}.", pointer=where, code=code)


def _scalar_problem(node: Any, path: tuple[str | int, ...]) -> JsonRefused | None:
    if isinstance(node, str):
        problem = _string_problem(node)
        return None if problem is None else _refusal("The string", path, problem)
    if isinstance(node, float) and not math.isfinite(node):
        return _refusal("The number", path, ("not_finite", "is out of range"))
    return None


def _too_deep(value: Any, max_depth: int) -> bool:
    """Whether containers nest deeper than ``max_depth``: breadth first, containers only."""
    level = [value] if isinstance(value, dict | list) else []
    depth = 0
    while level:
        depth += 1
        if depth > max_depth:
            return True
        below: list[Any] = []
        for node in level:
            children = node.values() if isinstance(node, dict) else node
            below.extend(c for c in children if isinstance(c, dict | list))
        level = below
    return False


def check_value(value: Any, *, max_depth: int = MAX_DEPTH) -> None:
    """Raise :class:`JsonRefused` if ``value`` (parsed JSON) nests deeper than ``max_depth``,
    or holds a string or key that cannot be stored, or a number that is not finite."""
    problem = _first_problem(value, max_depth)
    if problem is not None:
        raise problem


def _no_constants(name: str) -> Any:
    raise JsonRefused(f"{name} is not valid JSON.", code="invalid_json")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise JsonRefused(f"The number {text[:40]} is out of range.", code="not_finite")
    return number


# Only these escapes can put a NUL or a surrogate into a parsed string (raw control characters
# are invalid JSON, and decoded text holds no surrogates).
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def loads_bounded(text: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON text within the bounds of :func:`check_value`. Raises :class:`JsonRefused`
    for a refused document and ``ValueError`` (``json.JSONDecodeError``) for invalid JSON."""
    try:
        value = json.loads(text, parse_constant=_no_constants, parse_float=_finite)
    except RecursionError as exc:  # the C scanner's guard, far below any C stack limit
        raise JsonRefused(
            f"JSON nested deeper than {max_depth} levels is not accepted.", code="too_deep"
        ) from exc
    suspect = _SUSPECT_ESCAPE.search(text) or not _encodable(text)
    if suspect or _too_deep(value, max_depth):
        check_value(value, max_depth=max_depth)
    return value

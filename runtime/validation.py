"""Tool-call validation and repair: names, argument JSON, JSON Schema (all pure).

Models get tool calls slightly wrong in a few well-known ways: markdown fences around the JSON,
trailing commas, single quotes, Python literals, JSON encoded twice, a tool name in the wrong
case or with a ``functions.`` prefix. These are repaired; anything else comes back as an
:class:`Invalid` whose message tells the model what to send instead. Nothing here executes or
evaluates the model's text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

#: Larger argument payloads are refused before any repair is attempted.
MAX_ARGUMENT_CHARS = 1_000_000

_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}
_WORD = re.compile(r"[A-Za-z_]\w*")
_NAME_PREFIXES = ("functions.", "function.", "tools.", "tool.")


@dataclass(frozen=True)
class Invalid:
    """A call that cannot be made, with the message the model receives as the tool result."""

    message: str


@dataclass(frozen=True)
class ParsedJson:
    value: Any
    repairs: tuple[str, ...] = ()


@dataclass(frozen=True)
class ValidArguments:
    arguments: dict[str, Any]
    repairs: tuple[str, ...] = field(default_factory=tuple)


# --- lenient JSON ---------------------------------------------------------------------------


def _strip_fences(text: str) -> str:
    match = _FENCE.match(text)
    return match.group(1) if match else text


def _outermost_object(text: str) -> str:
    start, end = text.find("{"), text.rfind("}")
    return text[start : end + 1] if 0 <= start < end else text


def _read_string(text: str, start: int) -> tuple[str, int]:
    """The decoded body of the string literal opening at ``start`` and the index after it."""
    quote, i, out = text[start], start + 1, []
    while i < len(text) and text[i] != quote:
        if text[i] == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            # \' is legal only in single-quoted strings; JSON escapes are kept for json.loads.
            out.append(nxt if nxt == "'" else "\\" + nxt)
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out), i + 1


def _requote_string(body: str) -> str:
    """Re-emit a string body (with its JSON escapes intact) as a double-quoted JSON string."""
    escaped = re.sub(r'(?<!\\)((?:\\\\)*)"', r'\1\\"', body)
    return '"' + escaped.replace("\n", "\\n").replace("\t", "\\t") + '"'


def _next_significant(text: str, i: int) -> str:
    while i < len(text) and text[i].isspace():
        i += 1
    return text[i] if i < len(text) else ""


def _normalise_json(text: str) -> str:
    """Single quotes → double quotes, Python literals → JSON, trailing commas removed.

    One left-to-right scan that knows where strings are, so commas, quotes and words inside
    string values are never touched.
    """
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char in "'\"":
            body, i = _read_string(text, i)
            out.append(_requote_string(body))
            continue
        if char == "," and _next_significant(text, i + 1) in ("}", "]"):
            i += 1
            continue
        word = _WORD.match(text, i)
        if word:
            out.append(_PY_LITERALS.get(word.group(0), word.group(0)))
            i += len(word.group(0))
            continue
        out.append(char)
        i += 1
    return "".join(out)


def _loads(text: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(text)
    except (ValueError, RecursionError):
        return False, None


def parse_json_lenient(raw: str) -> ParsedJson | Invalid:
    """Parse model-written JSON, repairing the usual slips; say what was wrong otherwise."""
    text = raw.strip()
    if not text:
        return ParsedJson({}, ("empty arguments read as {}",))
    if len(text) > MAX_ARGUMENT_CHARS:
        return Invalid(
            f"The arguments are {len(text):,} characters long; the limit is "
            f"{MAX_ARGUMENT_CHARS:,}. Send smaller arguments."
        )
    ok, value = _loads(text)
    if ok:
        return _unwrap_double_encoding(ParsedJson(value))
    for repairs, candidate in _repair_candidates(text):
        ok, value = _loads(candidate)
        if ok:
            return _unwrap_double_encoding(ParsedJson(value, repairs))
    return Invalid(
        "The arguments are not valid JSON. Send one JSON object with double-quoted keys and "
        f'strings, e.g. {{"path": "README.md"}}. Received: {_preview(text)}'
    )


def _repair_candidates(text: str) -> Iterator[tuple[tuple[str, ...], str]]:
    unfenced = _strip_fences(text)
    fenced = ("removed markdown fences",) if unfenced != text else ()
    cut = (*fenced, "cut to the outermost object")
    for repairs, candidate in ((fenced, unfenced), (cut, _outermost_object(unfenced))):
        yield repairs, candidate
        yield (*repairs, "normalised quotes, literals and commas"), _normalise_json(candidate)


def _unwrap_double_encoding(parsed: ParsedJson) -> ParsedJson:
    if isinstance(parsed.value, str):
        inner = parse_json_lenient(parsed.value)
        if isinstance(inner, ParsedJson) and isinstance(inner.value, dict):
            return ParsedJson(inner.value, (*parsed.repairs, "decoded JSON encoded twice"))
    return parsed


def _preview(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def canonical_json(value: Any) -> str:
    """A stable text for comparing arguments: sorted keys, no insignificant whitespace."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# --- tool names ------------------------------------------------------------------------------


def _normalise_name(name: str) -> str:
    lowered = name.strip().lower()
    for prefix in _NAME_PREFIXES:
        if lowered.startswith(prefix):
            lowered = lowered[len(prefix) :]
    return re.sub(r"[\s.\-]+", "_", lowered)


def match_name(name: str, known: Iterable[str]) -> str | None:
    """``name`` as one of ``known``: exact, then ignoring case, prefixes and separators."""
    names = list(known)
    if name in names:
        return name
    wanted = _normalise_name(name)
    matches = [candidate for candidate in names if _normalise_name(candidate) == wanted]
    return matches[0] if len(matches) == 1 else None


def _edit_distance(a: str, b: str) -> int:
    """Optimal string alignment distance: insertions, deletions, substitutions, swaps."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        current = [i] + [0] * len(b)
        for j, char_b in enumerate(b, start=1):
            current[j] = min(
                previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)
            )
            if i > 1 and j > 1 and char_a == b[j - 2] and a[i - 2] == char_b:
                current[j] = min(current[j], previous2[j - 2] + 1)
        previous2, previous = previous, current
    return previous[-1]


def near_name(name: str, known: Iterable[str]) -> str | None:
    """The one known name a single typo away (``raed`` → ``read``), else None.

    Only names of four or more characters are corrected, and only when exactly one candidate
    is that close: a guess between two tools is not made for the model.
    """
    wanted = _normalise_name(name)
    if len(wanted) < 4:
        return None
    close = [c for c in known if _edit_distance(_normalise_name(c), wanted) <= 1]
    return close[0] if len(close) == 1 else None


# --- arguments against a JSON Schema ---------------------------------------------------------


def _coerce_scalar(value: Any, wanted: Any) -> Any:
    """Repair a string that plainly holds the scalar the schema asks for ("5" for integer)."""
    if not isinstance(value, str) or not isinstance(wanted, str):
        return value
    text = value.strip()
    if wanted == "integer" and re.fullmatch(r"-?\d+", text):
        return int(text)
    if wanted == "number" and re.fullmatch(r"-?\d+(\.\d+)?([eE][-+]?\d+)?", text):
        return float(text)
    if wanted == "boolean" and text.lower() in ("true", "false"):
        return text.lower() == "true"
    return value


def _coerce_properties(
    arguments: dict[str, Any], schema: Mapping[str, Any]
) -> tuple[dict[str, Any], tuple[str, ...]]:
    properties = schema.get("properties") or {}
    fixed = dict(arguments)
    repairs = []
    for key, value in arguments.items():
        wanted = (properties.get(key) or {}).get("type")
        coerced = _coerce_scalar(value, wanted)
        if coerced is not value:
            fixed[key] = coerced
            repairs.append(f"read {key!r} as {wanted}")
    return fixed, tuple(repairs)


def _describe_error(error: ValidationError) -> str:
    where = "".join(f"[{part!r}]" for part in error.absolute_path) or "top level"
    return f"{where}: {error.message}"


def _schema_summary(schema: Mapping[str, Any]) -> str:
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    parts = [
        f"{name} ({spec.get('type', 'any')}{', required' if name in required else ''})"
        for name, spec in properties.items()
    ]
    return ", ".join(parts) or "no parameters"


#: Validators by ``id`` of their schema, each entry holding the schema itself: the id cannot be
#: reused while the entry lives, and the identity check below rejects any other mapping.
_VALIDATORS: dict[int, tuple[Mapping[str, Any], Draft202012Validator]] = {}
_VALIDATORS_MAX = 512


def validator_for(schema: Mapping[str, Any]) -> Draft202012Validator:
    """The validator of a tool's parameter schema, built once per schema object."""
    cached = _VALIDATORS.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1]
    if len(_VALIDATORS) >= _VALIDATORS_MAX:
        _VALIDATORS.clear()  # schemas come and go with MCP servers and skills: stay bounded
    validator = Draft202012Validator(schema)
    _VALIDATORS[id(schema)] = (schema, validator)
    return validator


def validate_arguments(
    tool_name: str, raw: str, schema: Mapping[str, Any]
) -> ValidArguments | Invalid:
    """Parse (with repair) and validate one call's arguments against the tool's schema."""
    parsed = parse_json_lenient(raw)
    if isinstance(parsed, Invalid):
        return Invalid(f"Tool {tool_name!r} was not run. {parsed.message}")
    if not isinstance(parsed.value, dict):
        return Invalid(
            f"Tool {tool_name!r} was not run: the arguments must be a JSON object, not "
            f"{type(parsed.value).__name__}. Parameters: {_schema_summary(schema)}."
        )
    arguments, coercions = _coerce_properties(parsed.value, schema)
    errors = sorted(
        validator_for(schema).iter_errors(arguments),
        key=lambda error: [str(part) for part in error.path],
    )
    if errors:
        details = "; ".join(_describe_error(error) for error in errors[:5])
        return Invalid(
            f"Tool {tool_name!r} was not run: invalid arguments ({details}). "
            f"Parameters: {_schema_summary(schema)}. Fix the arguments and call it again."
        )
    return ValidArguments(arguments, (*parsed.repairs, *coercions))

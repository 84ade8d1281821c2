"""A JSON Schema object as form fields, and posted form values back as typed JSON (pure).

Holds: every field of :func:`schema_fields` turns what a browser posts for it back into the
JSON its schema describes (:func:`parse_values`), and :func:`posted_values` of a value gives
that value back (a round trip), so prefilled and untouched fields change nothing. Kinds:
a string with ``enum`` → ``select``; a string → ``text`` (``maxLength`` ≤ 200) or
``textarea``; ``integer`` / ``number`` (with ``minimum`` / ``maximum``); ``boolean`` →
``checkbox``; an array of enum strings → ``checkboxes``; anything else → ``json`` (a
textarea of JSON). A schema that is not an object with properties is one field for the whole
value (``name`` ""). Whether the values are *valid* is the server's call (the schema, checked
by the service); parsing only refuses what is not of the field's type (JSON held to the API's
bounds: :mod:`orchestrator.jsonlimits`). No Django: tested without a database.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.jsonlimits import JsonRefused, loads_bounded

#: Strings up to this ``maxLength`` get a one-line input; longer or unbounded, a textarea.
SHORT_TEXT = 200

Posted = Mapping[str, Sequence[str]]
"""What a form posts: field name → its values (``QueryDict.lists()``)."""


@dataclass(frozen=True)
class FormField:
    """One form field for property ``name`` of an object schema ("" for the whole value)."""

    name: str
    kind: str
    label: str
    help: str = ""
    required: bool = False
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    max_length: int | None = None


def _type(schema: Mapping[str, Any]) -> Any:
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"]: the one non-null type, if just one
        named = [k for k in kind if k != "null"]
        return named[0] if len(named) == 1 else None
    return kind


def _string_enum(schema: Mapping[str, Any]) -> tuple[str, ...] | None:
    values = schema.get("enum")
    if isinstance(values, list) and values and all(isinstance(v, str) for v in values):
        return tuple(values)
    return None


def _bound(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else None


def _kind(schema: Mapping[str, Any]) -> str:
    kind, choices = _type(schema), _string_enum(schema)
    if kind == "string" or (kind is None and choices):
        if choices:
            return "select"
        limit = schema.get("maxLength")
        short = isinstance(limit, int) and not isinstance(limit, bool) and limit <= SHORT_TEXT
        return "text" if short else "textarea"
    if kind in ("integer", "number", "boolean"):
        return "checkbox" if kind == "boolean" else str(kind)
    items = schema.get("items")
    if kind == "array" and isinstance(items, Mapping) and _string_enum(items):
        return "checkboxes"
    return "json"


def field_of(name: str, schema: Any, *, required: bool = False) -> FormField:
    """The field for one property (or, ``name`` "", the whole value) of schema ``schema``."""
    if not isinstance(schema, Mapping):
        return FormField(name=name, kind="json", label=name or "Value", required=required)
    kind = _kind(schema)
    choices = _string_enum(schema) or ()
    items = schema.get("items")
    if kind == "checkboxes" and isinstance(items, Mapping):
        choices = _string_enum(items) or ()
    limit = schema.get("maxLength")
    title, description = schema.get("title"), schema.get("description")
    return FormField(
        name=name,
        kind=kind,
        label=title if isinstance(title, str) and title else (name or "Value"),
        help=description if isinstance(description, str) else "",
        required=required,
        choices=choices,
        minimum=_bound(schema.get("minimum")),
        maximum=_bound(schema.get("maximum")),
        max_length=limit if isinstance(limit, int) and not isinstance(limit, bool) else None,
    )


def schema_fields(schema: Any) -> list[FormField]:
    """The fields of ``schema``: one per property of an object schema, or one for the whole
    value. Order: the ``required`` list's, then the other properties by name (an object's key
    order is not kept by every database: PostgreSQL's jsonb sorts the keys its own way)."""
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    if _type(schema if isinstance(schema, Mapping) else {}) not in ("object", None) or not (
        isinstance(properties, Mapping) and properties
    ):
        return [field_of("", schema)]
    wanted = schema.get("required")
    required = [n for n in wanted if n in properties] if isinstance(wanted, list) else []
    order = list(dict.fromkeys([*required, *sorted(properties, key=str)]))
    return [field_of(str(name), properties[name], required=name in required) for name in order]


def is_whole(fields: Sequence[FormField]) -> bool:
    """Whether ``fields`` is the one field of a schema that is not an object of properties."""
    return len(fields) == 1 and fields[0].name == ""


# --- values -> what a form shows --------------------------------------------------------------


def posted_value(field: FormField, value: Any, present: bool = True) -> list[str]:
    """What the form shows (and, untouched, posts) for ``value``; ``present`` False: absent."""
    if not present or (value is None and field.kind != "json"):
        return []
    if field.kind == "checkbox":
        return ["on"] if value is True else []
    if field.kind == "checkboxes" and isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    if field.kind in ("text", "textarea", "select") and isinstance(value, str):
        return [value]
    if field.kind in ("integer", "number") and _bound(value) is not None:
        return [json.dumps(value)]
    return [json.dumps(value, indent=2, ensure_ascii=False)]


def posted_values(fields: Sequence[FormField], value: Any) -> dict[str, list[str]]:
    """The initial form of ``value`` (an object for fields of properties)."""
    if is_whole(fields):
        return {"": posted_value(fields[0], value, value is not None)}
    given = value if isinstance(value, Mapping) else {}
    return {f.name: posted_value(f, given.get(f.name), f.name in given) for f in fields}


# --- what a form posts -> values --------------------------------------------------------------


class _Unset:
    """A field left empty: its property is left out."""


UNSET = _Unset()


def _number(field: FormField, text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        if field.kind == "integer":
            raise ValueError("Enter a whole number.") from None
    try:
        number = float(text)
    except ValueError:
        raise ValueError("Enter a number.") from None
    if not math.isfinite(number):
        raise ValueError("Enter a finite number.")
    return number


def parse_value(field: FormField, posted: Sequence[str]) -> Any:
    """The JSON value of one field from what was posted for it; :data:`UNSET` for an empty
    field. Raises ValueError (its message for the person) for a value not of the field's type."""
    if field.kind == "checkbox":
        return bool(posted) and posted[-1] not in ("", "off", "false")
    if field.kind == "checkboxes":
        chosen = set(posted)
        unknown = chosen - set(field.choices)
        if unknown:
            raise ValueError(f"Not a choice: {sorted(unknown)[0]}.")
        return [c for c in field.choices if c in chosen]
    text = posted[-1] if posted else ""
    if field.kind in ("text", "textarea", "select"):
        return text if text != "" else UNSET
    if not text.strip():
        return UNSET
    if field.kind in ("integer", "number"):
        return _number(field, text.strip())
    try:
        return loads_bounded(text)
    except JsonRefused as exc:
        raise ValueError(exc.detail) from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"Not valid JSON: {exc.msg} (line {exc.lineno}).") from None


def parse_values(fields: Sequence[FormField], posted: Posted) -> tuple[Any, dict[str, str]]:
    """The typed JSON of the posted form and the problems by field name. An object for fields
    of properties (empty fields left out); the value itself (None when empty) for one whole
    field."""
    values: dict[str, Any] = {}
    problems: dict[str, str] = {}
    for field in fields:
        try:
            value = parse_value(field, list(posted.get(field.name, ())))
        except ValueError as exc:
            problems[field.name] = str(exc)
            continue
        if value is not UNSET:
            values[field.name] = value
    if is_whole(fields):
        return values.get(""), problems
    return values, problems


def merged_input(
    fields: Sequence[FormField], proposed: Mapping[str, Any], posted: Posted
) -> tuple[Any, dict[str, str]]:
    """The call's arguments after a person edited them in the form: ``proposed`` with every
    field's value (an emptied field removes its property; properties the form does not show
    are kept). An unticked checkbox or an empty checkbox group does not add a property the
    proposal did not have, so an untouched form gives back ``proposed``."""
    values, problems = parse_values(fields, posted)
    if is_whole(fields):
        return values, problems
    merged = dict(proposed)
    for field in fields:
        if field.name in values:
            value = values[field.name]
            empty = (field.kind == "checkbox" and value is False) or (
                field.kind == "checkboxes" and value == []
            )
            if not (empty and field.name not in proposed):
                merged[field.name] = value
        elif field.name not in problems:
            merged.pop(field.name, None)
    return merged, problems


def review_rows(value: Any, schema: Any = None) -> list[tuple[str, str]]:
    """A review as (label, text) rows for a page: an object's properties one a row, in the
    order of ``schema``'s fields, then any others by name (a string as it is, a boolean as
    yes/no, a list of strings joined), anything else as compact JSON."""
    if not isinstance(value, Mapping) or not value:
        return [("Review", _shown(value))]
    known = [f.name for f in schema_fields(schema)] if schema is not None else []
    order = [k for k in known if k in value] + sorted(k for k in value if k not in known)
    return [(str(key), _shown(value[key])) for key in order]


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ", ".join(value) if value else "—"
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))

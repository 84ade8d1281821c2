"""Strict request shapes: every write serializer of the API refuses keys it does not know.

A typo (``actingOn`` for ``acting_on``) is a 400 naming the key, with the closest field as a
suggestion, instead of being silently dropped; a value of the wrong JSON type (``0`` for a
string or a boolean, ``"5"`` for a number) is a 400 instead of being coerced. Fields the
serializer declares read-only (``created_at``, ``version``, ...) are known and ignored, so a
client may send back what it got (GET, edit, PUT). Nested serializers built on these bases are
strict too; free-form JSON fields (``inputs``, ``policy``, ``params``) are judged by their own
validators.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any, TypeVar

from django.db.models import Model
from rest_framework import serializers

from orchestrator.jsonlimits import safe_text

_M = TypeVar("_M", bound=Model)
_CAMEL = re.compile(r"(?<=[a-z0-9])([A-Z])")


def _suggestion(key: str, writable: list[str]) -> str:
    snake = _CAMEL.sub(r"_\1", key).lower()
    if snake in writable:
        return snake
    close = difflib.get_close_matches(snake, writable, n=1, cutoff=0.75)
    return close[0] if close else ""


def unknown_field_errors(
    fields: Mapping[str, serializers.Field[Any, Any, Any, Any]], data: Any
) -> dict[str, list[str]]:
    """``{key: [message]}`` for each key of ``data`` that names none of ``fields``."""
    if not isinstance(data, Mapping):
        return {}
    unknown = sorted(str(key) for key in data if key not in fields)
    writable = [name for name, field in fields.items() if not field.read_only]
    errors: dict[str, list[str]] = {}
    for key in unknown:
        hint = _suggestion(key, writable)
        message = f"Unknown field {safe_text(key)!r}."
        errors[key] = [f"{message} Did you mean {hint!r}?" if hint else message]
    return errors


def _type_error(field: serializers.Field[Any, Any, Any, Any], value: Any) -> str | None:
    """Why ``value`` has the wrong JSON type for ``field`` (DRF would coerce it), or None."""
    if value is None:
        return None  # allow_null is the field's own check
    if isinstance(field, serializers.BooleanField):
        return None if isinstance(value, bool) else "Must be a JSON boolean (true or false)."
    if isinstance(field, serializers.CharField):
        return None if isinstance(value, str) else "Must be a JSON string."
    if isinstance(field, serializers.IntegerField | serializers.FloatField):
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return None if number else "Must be a JSON number."
    if isinstance(field, serializers.ListField) and isinstance(value, list):
        child = field.child
        wrong = next((why for item in value if (why := _type_error(child, item))), None)
        return None if wrong is None else f"Each item: {wrong}"
    return None


def type_errors(
    fields: Mapping[str, serializers.Field[Any, Any, Any, Any]], data: Any
) -> dict[str, list[str]]:
    """``{key: [message]}`` for each writable field whose value has the wrong JSON type:
    a number where a string is due, ``0`` or ``"true"`` for a boolean, ``"5"`` for a number."""
    if not isinstance(data, Mapping):
        return {}
    errors: dict[str, list[str]] = {}
    for name, field in fields.items():
        if field.read_only or name not in data:
            continue
        why = _type_error(field, data[name])
        if why:
            errors[name] = [why]
    return errors


def _refusals(fields: Mapping[str, serializers.Field[Any, Any, Any, Any]], data: Any) -> None:
    unknown = unknown_field_errors(fields, data)
    if unknown:
        raise serializers.ValidationError(unknown, code="unknown_field")
    mistyped = type_errors(fields, data)
    if mistyped:
        raise serializers.ValidationError(mistyped, code="invalid_type")


class StrictSerializer(serializers.Serializer[Any]):
    """A request body serializer that refuses unknown keys (400 naming each) and values of
    the wrong JSON type."""

    def to_internal_value(self, data: Any) -> Any:
        _refusals(self.fields, data)
        return super().to_internal_value(data)


class StrictModelSerializer(serializers.ModelSerializer[_M]):
    """A model serializer that refuses unknown keys and values of the wrong JSON type;
    read-only fields are ignored."""

    def to_internal_value(self, data: Any) -> Any:
        _refusals(self.fields, data)
        return super().to_internal_value(data)

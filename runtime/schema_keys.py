"""The keys a pydantic model allows at a point of a document, for errors that name them.

pydantic says "Extra inputs are not permitted" for an unknown key; an operator then has to
guess the right one. :func:`unknown_key_detail` turns that into "Unknown key 'budget': allowed
keys are approvals, budgets, …" by walking ``model`` along the error's location. Pure.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation may hold (through Optional, unions, lists, dicts)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is None:
        return []
    args = typing.get_args(annotation)
    if origin in (list, set, tuple, frozenset, Sequence) or origin in (dict, Mapping):
        args = args[-1:]  # the items, or a mapping's values
    elif origin not in (typing.Union, types.UnionType, typing.Annotated):
        return []
    return [model for arg in args for model in _models_in(arg)]


def _key_of(name: str, model: type[BaseModel]) -> str:
    alias = model.model_fields[name].alias
    return alias or name


def allowed_keys(model: type[BaseModel], location: Sequence[str | int]) -> list[str] | None:
    """The keys ``model`` allows in the object at ``location`` (the parent of an unknown key),
    or None when the location leads to no model (a free-form part)."""
    current: list[type[BaseModel]] = [model]
    for part in location:
        if isinstance(part, int):
            continue  # an item of a list: the item type was taken already
        following: list[type[BaseModel]] = []
        for each in current:
            by_key = {_key_of(name, each): name for name in each.model_fields}
            name = by_key.get(str(part))
            if name is not None:
                following += _models_in(each.model_fields[name].annotation)
        if not following:
            return None
        current = following
    return sorted({_key_of(name, m) for m in current for name in m.model_fields})


def unknown_key_detail(model: type[BaseModel], error: Mapping[str, Any]) -> str:
    """The detail of a pydantic error: for an unknown key, the keys allowed there."""
    location = list(error.get("loc") or ())
    if error.get("type") != "extra_forbidden" or not location:
        return str(error.get("msg", ""))
    keys = allowed_keys(model, location[:-1])
    if not keys:
        return str(error.get("msg", ""))
    return f"Unknown key {str(location[-1])!r}: allowed keys are {', '.join(keys)}."

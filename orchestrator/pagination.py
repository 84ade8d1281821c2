"""The API's one pagination: ``limit``/``offset``, range-checked.

DRF's own class silently replaces a bad ``limit`` with the default and passes any ``offset`` to
the database (``bigint out of range`` on PostgreSQL). Here a value that is not a whole number in
range is a 400 problem naming the parameter and its bounds.
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

MAX_LIMIT = 1000
MAX_OFFSET = 1_000_000_000


def bounded_int(params: Any, name: str, *, default: int, low: int, high: int) -> int:
    """Query parameter ``name`` as an int in ``[low, high]`` (``default`` when absent), else a
    400 naming the parameter and the bounds."""
    raw = params.get(name)
    if raw is None:
        return default
    text = str(raw).strip()
    if not text.isascii() or not text.isdigit() or len(text) > len(str(high)):
        raise ValidationError({name: [f"Must be a whole number from {low} to {high}."]})
    value = int(text)
    if not low <= value <= high:
        raise ValidationError({name: [f"Must be a whole number from {low} to {high}."]})
    return value


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """``limit`` 1..``MAX_LIMIT`` (default ``PAGE_SIZE``), ``offset`` 0..``MAX_OFFSET``."""

    max_limit = MAX_LIMIT
    max_offset = MAX_OFFSET

    def get_limit(self, request: Request) -> int:
        default = int(self.default_limit or 50)
        return bounded_int(
            request.query_params, self.limit_query_param, default=default, low=1, high=MAX_LIMIT
        )

    def get_offset(self, request: Request) -> int:
        return bounded_int(
            request.query_params, self.offset_query_param, default=0, low=0, high=MAX_OFFSET
        )

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        bounds = {
            self.limit_query_param: {"minimum": 1, "maximum": MAX_LIMIT},
            self.offset_query_param: {"minimum": 0, "maximum": MAX_OFFSET},
        }
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"] = {**parameter["schema"], **bounds.get(parameter["name"], {})}
        return parameters

"""The API's one pagination: ``limit``/``offset``, range-checked, with a bounded ``count``.

DRF's own class silently replaces a bad ``limit`` with the default and passes any ``offset`` to
the database (``bigint out of range`` on PostgreSQL). Here a value that is not a whole number in
range is a 400 problem naming the parameter and its bounds.

``count`` is exact up to ``COUNT_LIMIT`` matching rows and ``null`` beyond (as GitLab's API
drops its totals past 10,000): counting every match of a large history cost more than the page
(docs/performance.md, "A year of history"). ``next`` never depends on it: a page reads one row
more than it returns, so a further page is linked exactly when one exists.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.utils.urls import replace_query_param

MAX_LIMIT = 1000
MAX_OFFSET = 1_000_000_000
#: The most matching rows a list counts; past it ``count`` is ``null``.
COUNT_LIMIT = 10_000


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


def bounded_count(queryset: Any) -> int | None:
    """How many rows ``queryset`` has, counting at most ``COUNT_LIMIT + 1``: None past the limit."""
    if isinstance(queryset, QuerySet):
        n = queryset.order_by()[: COUNT_LIMIT + 1].count()
    else:
        n = len(queryset)
    return n if n <= COUNT_LIMIT else None


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """``limit`` 1..``MAX_LIMIT`` (default ``PAGE_SIZE``), ``offset`` 0..``MAX_OFFSET``;
    ``count`` exact up to ``COUNT_LIMIT``, else ``None``; ``next`` exactly when rows follow."""

    max_limit = MAX_LIMIT
    max_offset = MAX_OFFSET
    template = None  # the page controls of the browsable API need a total
    count: int | None
    #: The offset of the page after this one, None when this is the last.
    next_offset: int | None = None

    def paginate_queryset(
        self, queryset: Any, request: Request, view: Any = None
    ) -> list[Any] | None:
        self.request = request
        self.limit = limit = self.get_limit(request)
        self.offset = offset = self.get_offset(request)
        rows = list(queryset[offset : offset + limit + 1])
        more = len(rows) > limit
        del rows[limit:]
        self.next_offset = offset + limit if more else None
        if not more and (rows or offset == 0):
            self.count = offset + len(rows)  # the last page: the total is known
        else:
            self.count = bounded_count(queryset)
        return rows

    def get_next_link(self) -> str | None:
        if self.next_offset is None or self.request is None:
            return None
        url = replace_query_param(
            self.request.build_absolute_uri(), self.limit_query_param, self.limit
        )
        return replace_query_param(url, self.offset_query_param, self.next_offset)

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        response = super().get_paginated_response_schema(schema)
        response["properties"]["count"] = {
            "type": "integer",
            "nullable": True,
            "example": 123,
            "description": (
                f"Rows matching the filters: exact up to {COUNT_LIMIT:,}, null when more match "
                "(follow `next` to page on)."
            ),
        }
        return response

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

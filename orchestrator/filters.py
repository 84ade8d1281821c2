"""The API's filter backend: django-filter, with values range-checked before they reach SQL.

A filter value that parses but that the database cannot take (a date whose offset is beyond
±15:59 or moves it past year 9999 or before year 1, a number outside a 64-bit integer) is a 400
problem naming the parameter, instead of the database's error (500). So is a value the filter
would silently drop (``enabled=maybe``), and an empty value of a typed filter (``?run=``: leave
it out instead; an empty text filter means no filter). NUL characters in query parameters are
refused earlier, for every request, by :class:`orchestrator.middleware.BoundedRequestMiddleware`.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from typing import Any

from django.db.models import QuerySet
from django_filters import BooleanFilter, CharFilter, utils
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request

INT64_MAX = 2**63 - 1
MAX_UTC_OFFSET = dt.timedelta(hours=15, minutes=59)  # PostgreSQL's range for a displacement


def _out_of_range(value: Any) -> str | None:
    """Why the database cannot take ``value`` (a cleaned filter value), or None."""
    if isinstance(value, list | tuple):
        return next((why for why in map(_out_of_range, value) if why), None)
    if isinstance(value, slice):
        return _out_of_range([value.start, value.stop])
    if isinstance(value, dt.datetime):
        offset = value.utcoffset()
        if offset is not None and abs(offset) > MAX_UTC_OFFSET:
            return "The time-zone offset must be within ±15:59."
        try:
            value.astimezone(dt.UTC)
        except (OverflowError, ValueError):
            return "Must be a date-time between years 1 and 9999 in UTC."
        return None
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float | Decimal):
        finite = math.isfinite(value) if isinstance(value, float) else True
        if isinstance(value, Decimal):
            finite = value.is_finite()
        if not finite:
            return "Must be a finite number."
        if not -INT64_MAX <= value <= INT64_MAX:
            return f"Must be between {-INT64_MAX} and {INT64_MAX}."
    return None


class BoundedFilterBackend(DjangoFilterBackend):
    """:class:`DjangoFilterBackend` whose cleaned values are range-checked (400 otherwise)."""

    def filter_queryset(self, request: Request, queryset: QuerySet[Any], view: Any) -> Any:
        filterset = self.get_filterset(request, queryset, view)
        if filterset is None:
            return queryset
        if not filterset.is_valid() and self.raise_exception:
            raise utils.translate_validation(filterset.errors)
        problems: dict[str, list[str]] = {}
        for name, value in filterset.form.cleaned_data.items():
            why = _out_of_range(value)
            raw = request.query_params.get(name)
            typed = not isinstance(filterset.filters.get(name), CharFilter)
            if why is None and raw == "" and typed:
                why = "Must not be empty; leave the parameter out for no filter."
            elif why is None and raw not in (None, "") and value in (None, "", []):
                boolean = isinstance(filterset.filters.get(name), BooleanFilter)
                why = "Must be true or false." if boolean else "Not a valid value."
            if why:
                problems[name] = [why]
        if problems:
            raise ValidationError(problems)
        return filterset.qs

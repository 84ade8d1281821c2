"""The monitor's query: filters, search, a time range, a sort order and cursor pages.

A page is read by keyset (the sort value, then ``created_at`` and ``id``), never by offset, so
a page costs the same at the first run or the millionth. The cursor is opaque to people (a
base64 JSON tuple) and untrusted: one that does not decode, or names another sort, gives the
first page. Unknown filter values are ignored, as everywhere on the monitor.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db.models import DecimalField, F, IntegerField, Q, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from frontend.selectors import runs
from loops.models import LoopRun, RunStatus

#: The monitor's orders: label, and whether the sort value is a usage total (else: the time).
SORTS: dict[str, str] = {
    "newest": "Newest first",
    "oldest": "Oldest first",
    "cost": "Most cost",
    "tokens": "Most tokens",
}
#: Time ranges, by the age of the newest run they keep.
PERIODS: dict[str, tuple[str, timedelta]] = {
    "1h": ("Last hour", timedelta(hours=1)),
    "24h": ("Last 24 hours", timedelta(hours=24)),
    "7d": ("Last 7 days", timedelta(days=7)),
    "30d": ("Last 30 days", timedelta(days=30)),
}
_RUN_ID_PART = re.compile(r"^[0-9a-f][0-9a-f-]{3,35}$")


@dataclass(frozen=True)
class PageCursor:
    """Where a page starts: after (``forward``) or before the row with these sort keys."""

    sort: str
    value: str  # the usage total as text ("" for the time sorts)
    created_at: datetime
    id: uuid.UUID
    forward: bool = True

    def encode(self) -> str:
        raw = json.dumps([self.sort, self.value, self.created_at.isoformat(), str(self.id)])
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str, sort: str, *, forward: bool) -> PageCursor | None:
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            name, value, created, ident = json.loads(raw)
            at = parse_datetime(created)
            if name != sort or at is None or not isinstance(value, str):
                return None
            if value:
                Decimal(value)
            return cls(sort, value, at, uuid.UUID(ident), forward)
        except (ValueError, TypeError, binascii.Error, InvalidOperation):
            return None


@dataclass(frozen=True)
class RunFilters:
    """The monitor's filters, from GET parameters; unknown values are ignored, not trusted."""

    status: str = ""
    pattern: str = ""
    trigger: str = ""
    q: str = ""
    period: str = ""
    sort: str = "newest"
    cursor: PageCursor | None = None

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> RunFilters:
        status, trigger = query.get("status", ""), query.get("trigger", "")
        sort = query.get("sort", "newest")
        sort = sort if sort in SORTS else "newest"
        cursor = None
        if query.get("after"):
            cursor = PageCursor.decode(query["after"], sort, forward=True)
        elif query.get("before"):
            cursor = PageCursor.decode(query["before"], sort, forward=False)
        return cls(
            status=status if status in RunStatus.values else "",
            pattern=query.get("pattern", "")[:100],
            trigger=trigger if trigger in runs.TRIGGER_CHOICES else "",
            q=" ".join(query.get("q", "").split())[:200],
            period=query.get("period", "") if query.get("period", "") in PERIODS else "",
            sort=sort,
            cursor=cursor,
        )

    @property
    def active(self) -> bool:
        return bool(self.status or self.pattern or self.trigger or self.q or self.period)

    @property
    def first_page(self) -> bool:
        return self.cursor is None

    def since(self) -> datetime | None:
        return timezone.now() - PERIODS[self.period][1] if self.period else None

    def apply(self, rows: QuerySet[LoopRun]) -> QuerySet[LoopRun]:
        if self.status:
            rows = rows.filter(status=self.status)
        if self.pattern:
            rows = rows.filter(pattern__key=self.pattern)
        if self.trigger:
            rows = rows.filter(trigger_type=self.trigger)
        if self.period:
            rows = rows.filter(created_at__gte=self.since())
        if self.q:
            found = Q(goal__icontains=self.q) | Q(pattern__key__icontains=self.q)
            if _RUN_ID_PART.match(self.q.lower()):  # a whole id, or its start or shown end
                found |= Q(id__startswith=self.q.lower()) | Q(id__endswith=self.q.lower())
            rows = rows.filter(found)
        return rows

    def matches(self, run: LoopRun) -> bool:
        """Whether a run read for the live stream still belongs on this page."""
        since = self.since()
        text = self.q.lower()
        found = not text or (
            text in str(getattr(run, "goal_head", "") or "").lower()
            or text in run.pattern.key.lower()
            or str(run.id).startswith(text)
            or str(run.id).endswith(text)
        )
        return (
            (not self.status or run.status == self.status)
            and (not self.pattern or run.pattern.key == self.pattern)
            and (not self.trigger or run.trigger_type == self.trigger)
            and (since is None or run.created_at >= since)
            and found
        )

    def query(self, **changes: Any) -> dict[str, str]:
        """The filters (and sort) as GET parameters, for links and the live stream's URL."""
        f = replace(self, **changes) if changes else self
        pairs = {
            "status": f.status,
            "pattern": f.pattern,
            "trigger": f.trigger,
            "q": f.q,
            "period": f.period,
            "sort": "" if f.sort == "newest" else f.sort,
        }
        return {k: v for k, v in pairs.items() if v}


def _sort_value(rows: QuerySet[LoopRun], sort: str) -> QuerySet[LoopRun]:
    if sort == "cost":
        zero = Decimal(0)
        return rows.annotate(
            sort_value=Coalesce(F("cost_total"), zero, output_field=DecimalField())
        )
    if sort == "tokens":
        return rows.annotate(
            sort_value=Coalesce(F("tokens_in_total"), 0, output_field=IntegerField())
            + Coalesce(F("tokens_out_total"), 0, output_field=IntegerField())
        )
    return rows


def _keyset(cursor: PageCursor, descending: bool) -> Q:
    """Rows after ``cursor`` in an order by (sort value,) created_at, id, all ``descending``
    or all ascending."""
    op = "lt" if descending else "gt"
    at, ident = cursor.created_at, cursor.id
    by_time = Q(**{f"created_at__{op}": at}) | Q(created_at=at, **{f"id__{op}": ident})
    if not cursor.value:
        return by_time
    value = Decimal(cursor.value)
    return Q(**{f"sort_value__{op}": value}) | (Q(sort_value=value) & by_time)


@dataclass(frozen=True)
class RunsPage:
    runs: list[LoopRun]
    next_cursor: str = ""
    previous_cursor: str = ""
    first: bool = True  # no run comes before this page


def runs_page(filters: RunFilters, size: int) -> RunsPage:
    """One page of the monitor in the filters' order, with the cursors of its neighbours."""
    descending = filters.sort != "oldest"
    rows = _sort_value(filters.apply(runs.runs_for_table()), filters.sort)
    keys = ["created_at", "id"] if filters.sort in ("newest", "oldest") else [
        "sort_value", "created_at", "id",
    ]  # fmt: skip
    cursor = filters.cursor
    backwards = cursor is not None and not cursor.forward
    if cursor is not None:
        rows = rows.filter(_keyset(cursor, descending != backwards))
    down = descending != backwards
    rows = rows.order_by(*[f"-{k}" if down else k for k in keys])
    listed = list(rows[: size + 1])
    more = len(listed) > size
    listed = listed[:size]
    if backwards:
        listed.reverse()
    runs.with_budgets(listed)
    has_next = more if not backwards else True
    has_previous = (more if backwards else cursor is not None) and bool(listed)
    return RunsPage(
        first=not has_previous,
        runs=listed,
        next_cursor=_cursor_of(listed[-1], filters.sort) if has_next and listed else "",
        previous_cursor=_cursor_of(listed[0], filters.sort) if has_previous else "",
    )


def _cursor_of(run: LoopRun, sort: str) -> str:
    value = str(getattr(run, "sort_value", "") or 0) if sort in ("cost", "tokens") else ""
    return PageCursor(sort, value, run.created_at, run.id).encode()

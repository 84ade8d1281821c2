"""The event record of a skill execution: append-only, ordered, fenced by the lease.

Each append locks the execution's row (``FOR UPDATE`` on PostgreSQL; SQLite's IMMEDIATE write
lock), takes the next ``seq`` and inserts, all in one transaction, so ``seq`` order is commit
order and a reader that polls ``seq > cursor`` misses nothing. A worker's appends carry its
lease token: when the lease was taken over (the poller re-queued the execution, another worker
claimed it) the append writes nothing and returns False.

Terminal events are written in the same transaction as the status change, so a reader that
saw a finished status and then reads the events has the whole record.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction
from django.db.models import Max

from orchestrator import sql
from skillhub.models import (
    ExecutionEventType,
    ExecutionStatus,
    SkillExecution,
    SkillExecutionEvent,
)

_TABLE = SkillExecution._meta.db_table
#: Most events one read returns (``GET .../events?after=``).
EVENTS_PAGE = 500


def event_append(
    *,
    execution_id: uuid.UUID,
    type: ExecutionEventType,
    data: dict[str, Any] | None = None,
    lease_token: int | None = None,
) -> bool:
    """Append one event. With ``lease_token`` it is written only while the execution is running
    under that token (a worker's own event); returns whether it was written."""
    with transaction.atomic():
        # Constant SQL fragments; the id is a parameter.
        statement = f"SELECT status, lease_token FROM {_TABLE} WHERE id = %s{sql.for_update()}"  # noqa: S608
        rows = sql.fetch_all(statement, [sql.uuid_param(execution_id)])
        if not rows:
            return False
        status, token = rows[0]
        if lease_token is not None and (
            status != ExecutionStatus.RUNNING.value or int(token) != lease_token
        ):
            return False
        last = SkillExecutionEvent.objects.filter(execution_id=execution_id).aggregate(
            top=Max("seq")
        )["top"]
        SkillExecutionEvent.objects.create(
            execution_id=execution_id, seq=(last or 0) + 1, type=type, data=data or {}
        )
        return True


def events_after(execution_id: uuid.UUID, after: int, limit: int = EVENTS_PAGE) -> list[Any]:
    """The events with ``seq > after``, in order, at most ``limit``."""
    return list(
        SkillExecutionEvent.objects.filter(execution_id=execution_id, seq__gt=after).order_by(
            "seq"
        )[:limit]
    )

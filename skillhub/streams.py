"""The server-sent-events stream of one execution's events
(``GET /api/v1/skill-executions/{id}/events/stream``).

The transport is the platform's (``orchestrator.sse``): the database is the source of truth,
polled every ``SSE_POLL_SECONDS``; each new event goes out as ``event: event`` with
``id: <seq>`` and the event as JSON, so a reconnecting client (``Last-Event-ID``) resumes
exactly. The stream sends ``done`` and ends once the execution is finished and every event was
sent: the terminal event is committed together with the finished status
(``skillhub.services.events``), so reading the status first and the events second never ends
the stream early.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.http import HttpRequest, StreamingHttpResponse

from orchestrator.sse import Message, event_stream
from skillhub.models import FINISHED_STATUSES, SkillExecution, SkillExecutionEvent
from skillhub.services.events import EVENTS_PAGE, events_after

_FINISHED = frozenset(s.value for s in FINISHED_STATUSES)


def event_data(event: SkillExecutionEvent) -> dict[str, Any]:
    return {
        "seq": event.seq,
        "type": event.type,
        "data": event.data,
        "created_at": event.created_at,
    }


class ExecutionEventsFeed:
    """New events of one execution after a cursor; ``done`` once it is finished and drained."""

    def __init__(self, execution_id: uuid.UUID, after: int) -> None:
        self.execution_id = execution_id
        self.after = after
        self.finished = False

    def poll(self) -> list[Message]:
        status = (
            SkillExecution.objects.filter(pk=self.execution_id)
            .values_list("status", flat=True)
            .first()
        )
        if status is None:
            self.finished = True
            return [Message("done", {"status": "deleted"})]
        events = events_after(self.execution_id, self.after)
        out = []
        for event in events:
            out.append(Message("event", event_data(event), id=str(event.seq)))
            self.after = event.seq
        if status in _FINISHED and len(events) < EVENTS_PAGE:
            self.finished = True
            out.append(Message("done", {"status": status}, id=str(self.after)))
        return out

    def farewell(self) -> Message:
        return Message("bye", {}, id=str(self.after))


def execution_event_stream(
    request: HttpRequest, execution_id: uuid.UUID, after: int
) -> StreamingHttpResponse:
    """The execution's events after ``after``, as a server-sent-events response."""
    return event_stream(request, ExecutionEventsFeed(execution_id, after))

"""The W3C trace context a request arrives with (``traceparent``), for the runs it starts.

:class:`TraceparentMiddleware` sets :data:`TRACE_ID` from a valid ``traceparent`` header for
the request's duration; ``run_trigger`` gives the runs it creates that trace id, so their spans
join the caller's trace. The worker needs nothing more: the trace id travels on the run's row.
Pure parsing, no database.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextvars import ContextVar

from django.http import HttpRequest, HttpResponse

TRACE_ID: ContextVar[str] = ContextVar("trace_id", default="")
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


def trace_id_of(traceparent: str | None) -> str:
    """The trace id of a valid ``traceparent`` (version 00, or a later one read as 00), else
    "": version ``ff``, all-zero ids and extra fields on version 00 are invalid."""
    match = _TRACEPARENT.match((traceparent or "").strip())
    if match is None:
        return ""
    version, trace_id, parent_id, _, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or not int(trace_id, 16):
        return ""
    return trace_id if int(parent_id, 16) else ""


class TraceparentMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        token = TRACE_ID.set(trace_id_of(request.headers.get("traceparent")))
        try:
            return self.get_response(request)
        finally:
            TRACE_ID.reset(token)

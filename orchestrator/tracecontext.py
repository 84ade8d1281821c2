"""The W3C trace context a request arrives with (``traceparent``), for its logs and its runs.

:class:`TraceparentMiddleware` sets ``logcontext.TRACE_ID`` for the request's duration: the
trace id of a valid ``traceparent`` header, else a new one; and ``SPAN_ID``, a new id for the
request itself. Its log lines carry both, and ``run_trigger`` gives the runs it creates that
trace id, so their spans join the caller's trace. The worker needs nothing more: the trace id
travels on the run's row. Pure parsing, no database.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from orchestrator.logcontext import SPAN_ID, TRACE_ID

__all__ = ["SPAN_ID", "TRACE_ID", "TraceparentMiddleware", "caller_of", "new_span_id"]

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


def caller_of(traceparent: str | None) -> tuple[str, str]:
    """``(trace id, parent span id)`` of a valid ``traceparent`` (version 00, or a later one
    read as 00), else ``("", "")``: version ``ff``, all-zero ids and extra fields on version 00
    are invalid."""
    match = _TRACEPARENT.match((traceparent or "").strip())
    if match is None:
        return "", ""
    version, trace_id, parent_id, _, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or not int(trace_id, 16):
        return "", ""
    return (trace_id, parent_id) if int(parent_id, 16) else ("", "")


def trace_id_of(traceparent: str | None) -> str:
    """The trace id of a valid ``traceparent``, else ""."""
    return caller_of(traceparent)[0]


def new_trace_id() -> str:
    """A random 32-hex trace id (never all zeros)."""
    value = secrets.token_hex(16)
    return value if int(value, 16) else new_trace_id()


def new_span_id() -> str:
    """A random 16-hex span id (never all zeros)."""
    value = secrets.token_hex(8)
    return value if int(value, 16) else new_span_id()


class TraceparentMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        trace = TRACE_ID.set(trace_id_of(request.headers.get("traceparent")) or new_trace_id())
        span = SPAN_ID.set(new_span_id())
        try:
            return self.get_response(request)
        finally:
            TRACE_ID.reset(trace)
            SPAN_ID.reset(span)

"""What a log line is about, and log lines as JSON.

:data:`REQUEST_ID` is set for an HTTP request (``RequestIdMiddleware``, the ``/v1/`` views) and
:data:`RUN_ID` while a worker drives a run; :data:`TRACE_ID` and :data:`SPAN_ID` name the trace
and the span the work belongs to (a request's, ``orchestrator.tracecontext``; a run's or its
role invocation's, the worker). :class:`JsonFormatter` (``LOG_FORMAT=json``) writes each record
as one JSON object per line with them. Nothing here reads a database.
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from datetime import UTC, datetime

REQUEST_ID: ContextVar[str] = ContextVar("request_id", default="")
RUN_ID: ContextVar[str] = ContextVar("run_id", default="")
TRACE_ID: ContextVar[str] = ContextVar("trace_id", default="")
SPAN_ID: ContextVar[str] = ContextVar("span_id", default="")
_CONTEXT = (
    ("request_id", REQUEST_ID),
    ("run_id", RUN_ID),
    ("trace_id", TRACE_ID),
    ("span_id", SPAN_ID),
)
#: ``LOG_FORMAT`` values.
LOG_FORMATS = ("plain", "json")


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "message", "request_id"?, "run_id"?, "trace_id"?,
    "span_id"?, "exc"?}`` per line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, str] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, var in _CONTEXT:
            if value := var.get():
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def log_format(value: str | None) -> str:
    """The ``LOG_FORMAT`` setting checked: ``plain`` (default) or ``json``."""
    chosen = (value or "plain").strip().lower()
    if chosen not in LOG_FORMATS:
        raise ValueError(f"LOG_FORMAT must be one of {', '.join(LOG_FORMATS)}; got {value!r}")
    return chosen

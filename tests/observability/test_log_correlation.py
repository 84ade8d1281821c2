"""JSON log lines name the trace and the span they belong to: a request's (its caller's
``traceparent``, else a trace of its own, which the runs it starts share) and, in a worker, the
run's span or the span of the role invocation under way, the ids its exported spans carry."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
from typing import Any
from unittest import mock

import pytest
from django.db import DEFAULT_DB_ALIAS, connections
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory

from loops.models import LoopRun, RunStatus
from loops.services.claims import run_claim
from loops.services.runs import run_trigger
from loops.spans import invocation_span_id, run_span_id
from loops.worker.engine import drive_run
from orchestrator.logcontext import RUN_ID, TRACE_ID
from orchestrator.tracecontext import TraceparentMiddleware
from runtime.invocation import (
    InvocationOutcome,
    InvocationRequest,
    LoopRole,
    NothingToPrepare,
    OutcomeKind,
    StepJournal,
)
from tests.support.approvals import InlineDriver
from tests.support.factories import make_pattern, make_run
from tests.support.logs import json_lines

__all__ = ["json_lines"]
pytestmark = pytest.mark.django_db
CALLER = "0af7651916cd43dd8448eb211c80319c"


def lines(out: io.StringIO, message: str) -> list[dict[str, Any]]:
    parsed = [json.loads(line) for line in out.getvalue().splitlines()]
    return [line for line in parsed if line["message"] == message]


def test_a_requests_lines_carry_its_callers_trace_or_its_own_and_its_runs_share_it(
    json_lines: io.StringIO,
) -> None:
    pattern = make_pattern()
    started: list[LoopRun] = []

    def view(request: HttpRequest) -> HttpResponse:
        started.append(run_trigger(pattern=pattern, actor="test", inputs={}))
        logging.getLogger("loops.api").info("triggered")
        return HttpResponse("ok")

    before = TRACE_ID.get()
    middleware = TraceparentMiddleware(view)
    middleware(RequestFactory().post("/x", HTTP_TRACEPARENT=f"00-{CALLER}-b7ad6b7169203331-01"))
    middleware(RequestFactory().post("/x"))
    middleware(RequestFactory().post("/x", HTTP_TRACEPARENT=f"00-{CALLER}-0000000000000000-01"))
    logging.getLogger("after").info("triggered")
    traced, own, invalid, outside = lines(json_lines, "triggered")

    assert traced["trace_id"] == CALLER == started[0].trace_id
    assert own["trace_id"] == started[1].trace_id != CALLER
    assert invalid["trace_id"] == started[2].trace_id != CALLER  # a zero parent id is invalid
    spans = {line["span_id"] for line in (traced, own, invalid)}
    assert len(spans) == 3 and all(len(s) == 16 and int(s, 16) for s in spans)
    assert "b7ad6b7169203331" not in spans  # the caller's span is the parent, not this one
    assert outside.get("trace_id", "") == before  # the middleware gave the caller's back


class LoggingInvoker(NothingToPrepare):
    """Each invocation logs a line from inside its work, as the model client or a tool does."""

    async def invoke(
        self, request: InvocationRequest, journal: StepJournal, prepared: Any = None
    ) -> InvocationOutcome:
        logging.getLogger("runtime.loop").info("working on %s", request.invocation)
        outputs = {
            LoopRole.LEADER: {"tasks": [{"title": "do it"}]},
            LoopRole.MAKER: {"summary": "done"},
            LoopRole.VERIFIER: {"verdict": "pass", "reasons": ["fine"], "checks": []},
        }
        return InvocationOutcome(kind=OutcomeKind.COMPLETED, output=outputs[request.role])


def test_a_workers_lines_name_the_run_and_the_span_of_the_invocation_under_way(
    json_lines: io.StringIO,
) -> None:
    run = make_run(make_pattern())
    [claim] = run_claim(owner="log-test", lease_seconds=300, run_id=run.id)
    outer = connections[DEFAULT_DB_ALIAS]

    async def main() -> None:
        connections[DEFAULT_DB_ALIAS] = outer  # the engine's writes land in the test's transaction
        RUN_ID.set(str(run.id))  # as the driver sets it for the run's task
        await drive_run(InlineDriver(LoggingInvoker()), claim)  # type: ignore[arg-type]
        logging.getLogger("loops.worker").info("run driven")

    with mock.patch.dict(os.environ, {"DJANGO_ALLOW_ASYNC_UNSAFE": "true"}):
        asyncio.run(main())
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED

    parsed = [json.loads(line) for line in json_lines.getvalue().splitlines()]
    working = {
        line["message"].removeprefix("working on "): line
        for line in parsed
        if line["message"].startswith("working on ")
    }
    assert set(working) == {"leader", "maker:0", "verifier"}
    for invocation, line in working.items():
        assert line["run_id"] == str(run.id) and line["trace_id"] == run.trace_id
        assert line["span_id"] == invocation_span_id(run.trace_id, str(run.id), invocation)
    [after] = lines(json_lines, "run driven")
    assert after["span_id"] == run_span_id(run.trace_id, str(run.id))

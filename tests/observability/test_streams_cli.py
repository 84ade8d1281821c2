"""``loopwright watch`` on the run's live stream: a run written by the services while the CLI
follows it over the production ASGI app (roles, tools, tokens and cost as they happen), a
dropped stream resumed with ``Last-Event-ID``, and a run waiting for approval."""

from __future__ import annotations

import io
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from django.db import connection

from loops.services.steps import step_complete, tool_step_begin
from orchestrator import cli
from tests.observability.test_streams_api import (
    Server,
    _claimed,
    _finish,
    _model_step,
    asgi_server,
    stream_settings,
)
from tests.support.factories import make_pattern, make_run

__all__ = ["asgi_server", "stream_settings"]  # the API stream tests' fixtures


@pytest.mark.django_db(transaction=True)
def test_watch_prints_roles_tools_tokens_and_cost_as_the_run_goes(asgi_server: Server) -> None:
    run = make_run(make_pattern())
    lease = _claimed(run.id)
    started = threading.Event()

    def work() -> None:
        try:
            started.wait(20)
            _model_step(lease, 1)
            seq = tool_step_begin(
                lease,
                role="maker",
                invocation="maker-1",
                name="read_file",
                request={"arguments": {"path": "README.md"}},
            ).seq
            step_complete(lease, seq, response={"content": "text"})
            _model_step(lease, 2)
            _finish(lease)
        finally:
            connection.close()

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    out = _Started(started)
    api = cli.Api(url=asgi_server.url, token=asgi_server.token)
    try:
        code = cli.watch(api, str(run.id), out)
    finally:
        api.close()
    worker.join(timeout=30)
    text = out.getvalue()
    assert code == 0, text
    lines = text.splitlines()
    assert any("step 1  leader  model model-x  completed" in line for line in lines), text
    assert any("tokens 100→10  $0.0100" in line for line in lines), text
    assert any("step 2  maker  tool read_file  completed" in line for line in lines), text
    assert any("step 3  leader  model model-x" in line and "(run: 330 tokens, $0.0300)" in line
               for line in lines), text  # fmt: skip
    assert "verifying→succeeded" in text and "SUCCEEDED" in text
    assert "  tokens 330, cost $0.0300" in lines  # the run's budget usage, in the summary
    assert lines.count(f"  page: {asgi_server.url}/runs/{run.id}") == 2  # watching, and the end


class _Started(io.StringIO):
    """The CLI's output; sets ``started`` once the CLI printed its first event (it follows)."""

    def __init__(self, started: threading.Event) -> None:
        super().__init__()
        self.started = started

    def write(self, text: str) -> int:
        if "run.created" in text:
            self.started.set()
        return super().write(text)


# --- against a scripted server (MockTransport) ----------------------------------------------


def _sse(*messages: tuple[str, dict[str, Any]]) -> list[bytes]:
    return [f"event: {kind}\ndata: {cli.json.dumps(data)}\n\n".encode() for kind, data in messages]


def _dropping(chunks: list[bytes]) -> Iterator[bytes]:
    yield from chunks
    raise httpx2.ReadError("connection reset")


def _scripted(replies: list[Any], seen: list[httpx2.Request]) -> cli.Api:
    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        reply = replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, dict):
            return httpx2.Response(200, json=reply)
        return httpx2.Response(200, content=reply, headers={"content-type": "text/event-stream"})

    api = cli.Api(url="http://loopwright.test", token="t")
    api.client = httpx2.Client(
        base_url="http://loopwright.test", transport=httpx2.MockTransport(handler)
    )
    return api


EVENT_1 = {"seq": 1, "type": "run.created", "to_status": "queued", "created_at": None}
EVENT_2 = {"seq": 2, "type": "status.changed", "from_status": "queued", "to_status": "running"}
EVENT_3 = {"seq": 3, "type": "status.changed", "from_status": "running", "to_status": "succeeded"}
STEP_OPEN = {"seq": 1, "role": "maker", "kind": "tool", "name": "bash", "status": "started"}
STEP_DONE = {**STEP_OPEN, "status": "completed", "duration_ms": 1500}


def test_a_dropped_stream_is_resumed_with_last_event_id_and_nothing_printed_twice() -> None:
    run_id = str(uuid.uuid4())
    replies: list[Any] = [
        _dropping(_sse(("event", EVENT_1), ("step", STEP_OPEN), ("event", EVENT_2))),
        httpx2.ConnectError("restarting"),
        _sse(("step", STEP_OPEN), ("step", STEP_DONE), ("event", EVENT_3), ("done", {})),
        {"id": run_id, "pattern": "p", "status": "succeeded", "step_count": 1},
    ]
    seen: list[httpx2.Request] = []
    out = io.StringIO()
    assert cli.watch(_scripted(replies, seen), run_id, out, sleep=lambda s: None) == 0
    text = out.getvalue()
    assert text.count("run.created") == 1 and text.count("queued→running") == 1
    assert text.count("bash  started") == 1 and "bash  completed  1.5 s" in text
    assert "SUCCEEDED" in text and replies == []
    first, _, resumed, _ = seen
    assert "Last-Event-ID" not in first.headers and first.url.params["steps_after"] == "0"
    assert resumed.headers["Last-Event-ID"] == "2"
    assert resumed.url.params["steps_after"] == "0"  # step 1 was still open: sent again
    assert resumed.url.path == f"/api/v1/runs/{run_id}/stream"


def test_a_run_waiting_for_approval_says_how_to_decide_it() -> None:
    run_id, approval = str(uuid.uuid4()), str(uuid.uuid4())
    waiting = {
        "id": run_id,
        "status": "waiting_approval",
        "pending_approvals": [{"id": approval, "tool_name": "bash", "arguments": {"cmd": "ls"}}],
    }
    pending = {"results": [{"id": approval, "tool_name": "bash", "arguments": {"cmd": "ls"}}]}
    parked = {"id": run_id, "pattern": "p", "status": "waiting_approval", "step_count": 1}
    stopped = [_sse(("event", EVENT_1), ("run", waiting)), parked, pending]
    out = io.StringIO()
    assert cli.watch(_scripted(stopped, []), run_id, out, sleep=lambda s: None) == 2
    assert f"loopwright approve {approval}" in out.getvalue()
    assert f"loopwright reject {approval} --reason TEXT" in out.getvalue()

    running = {**waiting, "status": "running", "pending_approvals": []}
    done = {"id": run_id, "pattern": "p", "status": "succeeded", "step_count": 1}
    through = [_sse(("run", waiting), ("run", waiting), ("run", running), ("done", {})), done]
    out = io.StringIO()
    code = cli.watch(
        _scripted(through, []), run_id, out, sleep=lambda s: None, through_approvals=True
    )
    assert code == 0
    assert out.getvalue().count(f"loopwright approve {approval}") == 1
    assert "decide in another terminal" in out.getvalue()

"""OpenTelemetry export of a real run's spans: a worker process drives the run (the production
AgentInvoker against a scripted model over loopback HTTP), ``celery beat`` sends the span sweep,
and the worker's OTLP/HTTP exporter (the official SDK, configured by ``OTEL_*`` only) posts
them to a receiver on loopback that decodes the protobuf. The run was triggered through the
API with a ``traceparent``: its trace id is the caller's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loops.models import LoopRun, LoopSpan, RunStatus
from orchestrator import otel
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import api_token_create, user_ensure
from tests.e2e.conftest import start_beat, start_worker
from tests.support.approvals import approval_pattern, http_reply, loopback_team
from tests.support.model_server import ModelServer
from tests.support.otlp import Receiver, attributes, receiver
from tests.support.workers import WorkerProcess, wait_for

pytestmark = [pytest.mark.one_backend]

__all__ = ["receiver"]

TRACE = "5b8efff798038103d269b633813fc60c"
WAIT = 240  # generous: the machine is shared and loaded; the assertions stay strict


@pytest.fixture
def model() -> Iterator[ModelServer]:
    with ModelServer() as server:
        server.always(http_reply)
        yield server
    server.check()


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("seeded_profiles")
@pytest.mark.timeout(600)
def test_a_runs_spans_reach_an_otlp_receiver_with_the_callers_trace_and_genai_attributes(
    tmp_path: Path,
    workers: list[WorkerProcess],
    procs: list[Any],
    receiver: Receiver,
    model: ModelServer,
    live_server: Any,
) -> None:
    loopback_team(model.url, "otel")
    pattern = approval_pattern("otel-e2e")
    otlp = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    worker = start_worker(
        workers,
        tmp_path,
        "otel",
        LOOPWRIGHT_INVOKER="loops.worker.invoker.AgentInvoker",
        **otlp,
    )
    start_beat(procs, tmp_path, LOOPWRIGHT_SPAN_SWEEP_SECONDS="1")
    token = api_token_create(user=user_ensure(username="operator", roles=[Role.OPERATOR]))
    answer = httpx.post(
        f"{live_server.url}/api/v1/patterns/{pattern.key}/trigger",
        json={"inputs": {"rounds": [[["list", {"path": "."}]]]}},
        headers={
            "Authorization": f"Bearer {token}",
            "traceparent": f"00-{TRACE}-a3ce929d0e0e4736-01",
        },
        timeout=30,
    )
    assert answer.status_code == 201, answer.text
    run = LoopRun.objects.get(pk=answer.json()["id"])
    assert run.trace_id == TRACE

    def done() -> bool:
        return LoopRun.objects.get(pk=run.id).status == RunStatus.SUCCEEDED

    wait_for(done, timeout=WAIT, interval=0.5, message=worker.log()[-4000:])
    stored: dict[str, LoopSpan] = {}

    def received_all() -> bool:  # the sweep stores the spans, then the worker exports them
        stored.update({s.span_id: s for s in LoopSpan.objects.filter(run=run)})
        return bool(stored) and len(receiver.of_trace(TRACE)) >= len(stored)

    wait_for(
        received_all,
        timeout=WAIT,
        interval=0.5,
        message=f"{len(receiver.of_trace(TRACE))} spans received\n{worker.log()[-4000:]}",
    )
    spans = {s.span_id.hex(): s for s in receiver.of_trace(TRACE)}
    assert set(spans) == set(stored)
    [root] = [s for s in spans.values() if not s.parent_span_id]
    assert attributes(root)["gen_ai.operation.name"] == "invoke_agent"
    for span_id, span in spans.items():
        row = stored[span_id]
        assert span.start_time_unix_nano == otel.unix_ns(row.started_at)
        assert span.end_time_unix_nano == otel.unix_ns(row.ended_at)
        assert (span.parent_span_id.hex() if span.parent_span_id else "") == row.parent_span_id
    invocations = [s for s in spans.values() if s.parent_span_id == root.span_id]
    assert sorted(attributes(s)["gen_ai.agent.name"] for s in invocations) == [
        "leader",
        "maker",
        "verifier",
    ]
    chats = [
        attributes(s) for s in spans.values() if attributes(s)["loopwright.span.kind"] == "model"
    ]
    assert len(chats) == 4  # the leader, the maker twice (the call, the answer), the verifier
    for chat in chats:
        assert chat["gen_ai.operation.name"] == "chat"
        assert chat["gen_ai.request.model"] == "approvals-script"
        assert (chat["gen_ai.usage.input_tokens"], chat["gen_ai.usage.output_tokens"]) == (10, 5)
        assert chat["loopwright.endpoint"] == "otel-loopback"
    [tool] = [
        attributes(s) for s in spans.values() if attributes(s)["loopwright.span.kind"] == "tool"
    ]
    assert (tool["gen_ai.operation.name"], tool["gen_ai.tool.name"]) == ("execute_tool", "list")
    assert tool["loopwright.tool.tier"] == "read" and "loopwright.input" in tool


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
    ],
)
def test_export_is_on_only_when_the_otel_variables_ask_for_it(
    env: dict[str, str], on: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_TRACES_EXPORTER",
        "OTEL_SDK_DISABLED",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert otel.enabled() is on

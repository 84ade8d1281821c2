"""A ``/v1/chat/completions`` request joins its caller's trace: a ``traceparent`` sent with it
is its record's trace id, and its ``invoke_agent`` span (GenAI semantic conventions) reaches
an OTLP receiver on loopback as a child of the caller's span; without one it has a trace of
its own. The real app under uvicorn, the official SDK's exporter, a model over loopback HTTP."""

from __future__ import annotations

import httpx2
import pytest

from gateway.models import ChatCompletionRecord
from orchestrator import otel
from tests.gateway.conftest import Team
from tests.support.model_server import Completion, streamed
from tests.support.otlp import Receiver, attributes, exporting, receiver
from tests.support.workers import wait_for

__all__ = ["exporting", "receiver"]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


def chat(server: str, key: str, stream: bool, headers: dict[str, str]) -> httpx2.Response:
    body = {"model": "ada", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    with httpx2.Client(timeout=30) as http:
        return http.post(
            f"{server}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}", **headers},
        )


def recorded(count: int) -> list[ChatCompletionRecord]:
    wait_for(lambda: ChatCompletionRecord.objects.count() >= count, timeout=10)
    return list(ChatCompletionRecord.objects.order_by("created_at"))


def test_a_chat_request_joins_the_callers_trace_and_exports_its_agent_span(
    server: str, team: Team, exporting: Receiver
) -> None:
    key = team.caller("alice", team.employee("ada"))
    team.model.queue(Completion(content="Hello.", usage=(12, 4)))
    traceparent = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}
    answer = chat(server, key, False, traceparent)
    assert answer.status_code == 200, answer.text
    (record,) = recorded(1)
    assert record.trace_id == CALLER_TRACE

    wait_for(lambda: otel.flush() and bool(exporting.of_trace(CALLER_TRACE)), timeout=20)
    [span] = exporting.of_trace(CALLER_TRACE)
    assert span.parent_span_id.hex() == CALLER_SPAN
    assert span.name == "invoke_agent ada" and span.kind == span.SPAN_KIND_SERVER
    found = attributes(span)
    assert found["gen_ai.operation.name"] == "invoke_agent"
    assert found["gen_ai.agent.name"] == "ada"
    assert found["gen_ai.response.id"] == answer.json()["id"] == record.id
    assert (found["gen_ai.usage.input_tokens"], found["gen_ai.usage.output_tokens"]) == (12, 4)
    assert span.end_time_unix_nano > span.start_time_unix_nano

    # Streamed, with no traceparent: a trace of its own, the span a root of it.
    team.model.queue(streamed(Completion(content="Hi again.", usage=(7, 3))))
    assert chat(server, key, True, {}).status_code == 200
    own = recorded(2)[1].trace_id
    assert own != CALLER_TRACE and len(own) == 32 and int(own, 16)
    wait_for(lambda: otel.flush() and bool(exporting.of_trace(own)), timeout=20)
    [root] = exporting.of_trace(own)
    assert not root.parent_span_id and attributes(root)["loopwright.chat.stream"] is True

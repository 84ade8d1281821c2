"""Progress events of skill executions: the ordered record written by the real execution path
(a ``celery worker`` on the skills queue and the real sandbox), its REST list and SSE stream,
and fencing: a worker whose lease was taken over writes no more events."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import user_ensure
from skillhub.models import Skill, SkillExecution, SkillExecutionEvent
from skillhub.services.access import Caller
from skillhub.services.executions import (
    execution_claim,
    execution_fail,
    execution_request,
    execution_run,
    executions_recover,
)
from tests.skillhub.conftest import SKILL_QUEUE, SkillsWorker
from tests.support.workers import wait_for

pytestmark = [
    pytest.mark.one_backend,
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
]
PROBLEM = "application/problem+json"
#: Prints a line every 0.4 s for about 2 s: long enough for progress events.
TICKER = (
    "import sys, time\n"
    "for i in range({{a}}):\n"
    "    print('tick', i, flush=True)\n"
    "    print('err', i, file=sys.stderr, flush=True)\n"
    "    time.sleep(0.4)\n"
)
COUNT = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def operator_caller() -> Caller:
    return Caller.for_user(user_ensure(username="operator", roles=[Role.OPERATOR]))


def sse_messages(raw: str) -> list[dict[str, Any]]:
    """Parse a text/event-stream body into [{event, id, data}] (comments and retry skipped)."""
    out = []
    for block in raw.split("\n\n"):
        fields: dict[str, Any] = {}
        for line in block.splitlines():
            if line.startswith(":") or ":" not in line:
                continue
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
        if "event" in fields:
            fields["data"] = json.loads(fields.get("data", "{}"))
            out.append(fields)
    return out


def test_a_run_records_every_stage_in_order_with_progress(
    skills_worker: SkillsWorker,
    api_client_for: Callable[[str], APIClient],
    make_skill: Callable[..., Skill],
) -> None:
    make_skill("ticker", code_template=TICKER, input_schema=COUNT)
    client = api_client_for("operator")
    response = client.post("/api/v1/skills/ticker/test", {"inputs": {"a": 5}}, format="json")
    assert response.status_code == 200, (response.content, skills_worker.log()[-3000:])
    execution = response.json()
    assert execution["status"] == "succeeded"

    events = client.get(f"/api/v1/skill-executions/{execution['id']}/events").json()
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    kinds = types(events)
    assert kinds[:4] == ["queued", "claimed", "rendering", "sandbox_started"], kinds
    assert kinds[-1] == "succeeded"
    assert set(kinds[4:-1]) == {"progress"}, kinds
    claimed = events[1]["data"]
    assert claimed["attempt"] == 1 and claimed["worker"]
    assert events[3]["data"]["backend"] in ("bubblewrap", "rlimit-only")
    # The program runs ~2 s: at least one report while it ran, with output counted so far.
    progress = [e["data"] for e in events if e["type"] == "progress"]
    assert progress, kinds
    assert all(p["elapsed_seconds"] > 0 for p in progress)
    assert progress[-1]["stdout_bytes"] > 0 and progress[-1]["stderr_bytes"] > 0
    elapsed = [p["elapsed_seconds"] for p in progress]
    assert elapsed == sorted(elapsed)
    done = events[-1]["data"]
    assert done["exit_code"] == 0 and done["duration_ms"] >= 1000
    assert done["stdout_bytes"] == len(execution["stdout"].encode())

    later = client.get(f"/api/v1/skill-executions/{execution['id']}/events", {"after": 2}).json()
    assert [e["seq"] for e in later] == [e["seq"] for e in events[2:]]
    bad = client.get(f"/api/v1/skill-executions/{execution['id']}/events", {"after": "-1"})
    assert bad.status_code == 400 and bad["Content-Type"] == PROBLEM
    missing = client.get(f"/api/v1/skill-executions/{uuid.uuid4()}/events")
    assert missing.status_code == 404 and missing["Content-Type"] == PROBLEM


def test_a_timeout_and_a_failure_end_with_their_own_events(
    skills_worker: SkillsWorker,
    api_client_for: Callable[[str], APIClient],
    make_skill: Callable[..., Skill],
) -> None:
    make_skill("sleeper", code_template="import time\ntime.sleep({{a}})\n", input_schema=COUNT,
               timeout_seconds=1)  # fmt: skip
    make_skill("crasher", code_template="import sys\nsys.exit({{a}})\n", input_schema=COUNT)
    client = api_client_for("operator")
    slow = client.post("/api/v1/skills/sleeper/test", {"inputs": {"a": 30}}, format="json").json()
    bad = client.post("/api/v1/skills/crasher/test", {"inputs": {"a": 3}}, format="json").json()
    assert (slow["status"], bad["status"]) == ("failed", "failed"), skills_worker.log()[-3000:]

    slow_events = client.get(f"/api/v1/skill-executions/{slow['id']}/events").json()
    assert slow_events[-1]["type"] == "timed_out"
    assert slow_events[-1]["data"]["killed_reason"] == "timeout"
    assert slow_events[-1]["data"]["duration_ms"] >= 1000
    bad_events = client.get(f"/api/v1/skill-executions/{bad['id']}/events").json()
    assert bad_events[-1]["type"] == "failed"
    assert bad_events[-1]["data"]["exit_code"] == 3
    assert bad_events[-1]["data"]["error"] == "the program exited with status 3"


def test_the_event_stream_follows_a_run_to_its_end(
    skills_worker: SkillsWorker,
    api_client_for: Callable[[str], APIClient],
    make_skill: Callable[..., Skill],
    settings: Any,
) -> None:
    settings.LOOPWRIGHT_UI = {"SSE_POLL_SECONDS": 0.2, "SSE_MAX_SECONDS": 120}
    skill = make_skill("ticker", code_template=TICKER, input_schema=COUNT)
    execution = execution_request(
        skill=skill, inputs={"a": 5}, caller=operator_caller(), origin="api"
    )
    client = api_client_for("viewer")
    url = f"/api/v1/skill-executions/{execution.id}/events/stream"
    response = client.get(url, HTTP_ACCEPT="text/event-stream")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/event-stream")
    # The stream ends by itself once the execution is finished and every event was sent.
    raw = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    messages = sse_messages(raw)
    assert messages[-1]["event"] == "done", raw[-2000:]
    assert messages[-1]["data"] == {"status": "succeeded"}
    sent = [m for m in messages if m["event"] == "event"]
    stored = list(SkillExecutionEvent.objects.filter(execution=execution).order_by("seq"))
    assert [int(m["id"]) for m in sent] == [e.seq for e in stored]
    assert [m["data"]["type"] for m in sent] == [e.type for e in stored]
    assert "progress" in [e.type for e in stored]

    # A reconnect with Last-Event-ID resumes after it; a finished execution ends at once.
    again = client.get(url, HTTP_ACCEPT="text/event-stream", HTTP_LAST_EVENT_ID="3")
    resumed = sse_messages(b"".join(again.streaming_content).decode())  # type: ignore[attr-defined]
    assert [int(m["id"]) for m in resumed if m["event"] == "event"] == [
        e.seq for e in stored if e.seq > 3
    ]
    gone = client.get(
        f"/api/v1/skill-executions/{uuid.uuid4()}/events/stream", HTTP_ACCEPT="text/event-stream"
    )
    assert gone.status_code == 404


def test_the_events_endpoints_are_in_the_openapi_schema(
    api_client_for: Callable[[str], APIClient],
) -> None:
    schema = api_client_for("viewer").get("/api/schema/", {"format": "json"}).json()
    paths = schema["paths"]
    assert "/api/v1/skill-executions/{id}/events" in paths
    stream = paths["/api/v1/skill-executions/{id}/events/stream"]["get"]
    assert "text/event-stream" in stream["responses"]["200"]["content"]


def _run_in_thread(execution_id: uuid.UUID, owner: str) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []

    def work() -> None:
        try:
            box.append(execution_run(execution_id=execution_id, owner=owner))
        except BaseException as exc:  # surfaced by the test
            box.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=work)
    thread.start()
    return thread, box


def test_a_worker_that_lost_its_lease_writes_no_more_events(
    make_skill: Callable[..., Skill], settings: Any
) -> None:
    # No worker consumes this queue: the test plays both workers with the real execution path.
    settings.SKILLHUB = {**settings.SKILLHUB, "QUEUE": f"{SKILL_QUEUE}-fencing"}
    skill = make_skill("ticker", code_template=TICKER, input_schema=COUNT, timeout_seconds=20)
    execution = execution_request(
        skill=skill, inputs={"a": 8}, caller=operator_caller(), origin="api"
    )
    thread, box = _run_in_thread(execution.id, "worker-a")
    try:
        wait_for(
            lambda: SkillExecutionEvent.objects.filter(
                execution=execution, type="progress"
            ).exists(),
            timeout=60,
        )
        # Worker A stalls as far as the database can tell: its lease expires, the poller
        # re-queues the execution and worker B claims it (a new token).
        SkillExecution.objects.filter(pk=execution.id).update(
            lease_expires_at=timezone.now() - timedelta(seconds=5)
        )
        assert executions_recover().requeued == [execution.id]
        lease_b = execution_claim(execution_id=execution.id, owner="worker-b")
        assert lease_b is not None
        taken_at = SkillExecutionEvent.objects.filter(execution=execution).count()
        time.sleep(2.5)  # worker A keeps running its program and reporting into the void
    finally:
        thread.join(timeout=120)
    assert not isinstance(box[0], BaseException), box
    events = list(SkillExecutionEvent.objects.filter(execution=execution).order_by("seq"))
    assert len(events) == taken_at, [(e.seq, e.type) for e in events[taken_at:]]
    kinds = [e.type for e in events]
    requeued = kinds.index("requeued")
    assert kinds[requeued:] == ["requeued", "claimed"], kinds
    assert events[requeued].data["worker"] == "worker-a" and events[requeued].data["by"] == "poller"
    assert events[-1].data == {"worker": "worker-b", "attempt": 2, "max_attempts": 3}
    # Worker A's result was not stored either; worker B still owns the execution.
    current = SkillExecution.objects.get(pk=execution.id)
    assert (current.status, current.lease_owner, current.stdout) == ("running", "worker-b", "")
    assert execution_fail(lease=lease_b, error="test over")
    assert SkillExecutionEvent.objects.filter(execution=execution).last().type == "failed"  # type: ignore[union-attr]

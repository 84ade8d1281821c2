"""From outside: a pattern whose profile sets ``limits.maxInvocations`` to 2, run by a real worker
process (the production AgentInvoker) against a scripted OpenAI-compatible model served over
HTTP on loopback, ends after two invocations with a terminal reason naming the setting and the
layer that set it (issue 18). Likewise ``limits.timeoutMs`` stops a maker that never ends, in
the worker's own threads."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from harness.services import profile_create
from loops.models import LoopEvent, LoopRun, LoopStep, RunStatus
from loops.services.patterns import pattern_create
from orchestrator.agents.services import employee_create, model_endpoint_create
from tests.e2e.conftest import start_worker
from tests.support.limits import PASS, PLAN, role_of
from tests.support.model_server import Completion, Delay, ModelServer, RecordedRequest
from tests.support.workers import WorkerProcess, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
    pytest.mark.timeout(600),
]
AGENT = {"LOOPWRIGHT_INVOKER": "loops.worker.invoker.AgentInvoker"}
LEADER, MAKER, VERIFIER = "hl-leader", "hl-maker", "hl-verifier"


def script(request: RecordedRequest) -> Completion:
    """The leader plans, the maker reads one file and answers, the verifier passes."""
    messages = request.body["messages"]
    role = role_of(messages)
    if role == "leader":
        return Completion(content=json.dumps(PLAN), usage=(40, 10))
    if role == "verifier":
        return Completion(content=json.dumps(PASS), usage=(40, 10))
    if any(m.get("role") == "tool" for m in messages):
        return Completion(content="Read it; done.", usage=(40, 10))
    return Completion(tool_calls=[("list", json.dumps({"path": "."}))], usage=(40, 10))


def endless(request: RecordedRequest) -> Completion | Delay:
    """As :func:`script`, but the maker never stops calling tools, 0.2 s a call."""
    messages = request.body["messages"]
    if role_of(messages) != "maker":
        return script(request)
    made = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
    # Alternating tools and arguments, so the runtime's own repetition guard never ends it.
    call = (
        ("read", json.dumps({"path": f"f{made}.txt"}))
        if made % 2
        else ("list", json.dumps({"path": f"d{made}"}))
    )
    return Delay(0.2, Completion(tool_calls=[call], usage=(40, 10)))


@pytest.fixture
def model() -> Iterator[ModelServer]:
    with ModelServer() as server:
        server.always(
            lambda request: (
                endless(request) if "[endless]" in str(request.body) else script(request)
            )
        )
        yield server
    server.check()


def team(model: ModelServer, tag: str, settings: dict[str, object], key: str, goal: str) -> None:
    endpoint = model_endpoint_create(
        name=f"hl-loopback-{key}", provider="openai", base_url=model.url, model="hl-script",
        max_retries=1, timeout_seconds=60,
    )  # fmt: skip
    for username in (LEADER, MAKER, VERIFIER):
        employee_create(
            username=f"{username}-{key}", endpoint=endpoint, tools=["read", "list"], max_steps=200
        )
    profile_create(tag=tag, settings=settings)
    pattern_create(
        key=key,
        actor="test",
        goal_template=goal,
        leader_username=f"{LEADER}-{key}",
        maker_usernames=[f"{MAKER}-{key}"],
        verifier_username=f"{VERIFIER}-{key}",
        leader_harness_tag=tag,
        maker_harness_tag=tag,
        verifier_harness_tag=tag,
    )


def run_until_failed(
    key: str, tmp_path: Path, workers: list[WorkerProcess], client: APIClient
) -> LoopRun:
    start_worker(workers, tmp_path, "hlimits", **AGENT)
    response = client.post(f"/api/v1/patterns/{key}/trigger", {}, format="json")
    assert response.status_code == 201, response.content
    run_id = response.json()["id"]

    def status() -> str:
        return str(LoopRun.objects.get(pk=run_id).status)

    wait_for(
        lambda: status() == RunStatus.FAILED,
        timeout=240,
        interval=0.3,
        message=f"{status()}\n" + "\n".join(w.log()[-3000:] for w in workers),
    )
    return LoopRun.objects.get(pk=run_id)


def test_max_invocations_two_ends_the_run_after_two_invocations_naming_the_layer(
    model: ModelServer,
    tmp_path: Path,
    workers: list[WorkerProcess],
    api_client_for: Callable[[str], APIClient],
) -> None:
    team(model, "tight", {"limits": {"maxInvocations": 2}}, "hl-tight", "Look around.")
    client = api_client_for("operator")
    run = run_until_failed("hl-tight", tmp_path, workers, client)
    run_id = str(run.id)
    assert run.terminal_reason == "harness_limit:limits.maxInvocations"
    assert run.failure_reason == (
        "limits.maxInvocations = 2 (set by profile:tight@1): 2 invocations ran"
    )
    started = LoopEvent.objects.filter(run=run, type="invocation.started")
    assert sorted(e.data["invocation"] for e in started) == ["leader", "maker:0"]
    event = LoopEvent.objects.get(run=run, type="harness.limit_reached")
    assert (event.data["setting"], event.data["value"], event.data["layer"]) == (
        "limits.maxInvocations",
        2,
        "profile:tight@1",
    )
    assert not LoopStep.objects.filter(run=run, role="verifier").exists()
    assert [role_of(r.body["messages"]) for r in model.requests].count("verifier") == 0
    detail = client.get(f"/api/v1/runs/{run_id}").json()
    assert detail["terminal_reason"] == "harness_limit:limits.maxInvocations"
    assert "profile:tight@1" in detail["failure_reason"]


def test_timeout_ms_stops_a_maker_that_never_ends_in_a_real_worker(
    model: ModelServer,
    tmp_path: Path,
    workers: list[WorkerProcess],
    api_client_for: Callable[[str], APIClient],
) -> None:
    team(model, "brief", {"limits": {"timeoutMs": 3000}}, "hl-brief", "Look around. [endless]")
    run = run_until_failed("hl-brief", tmp_path, workers, api_client_for("operator"))
    time.sleep(1)  # a write the deadline cut short may still finish on its thread
    assert run.terminal_reason == "harness_limit:limits.timeoutMs"
    assert run.failure_reason.startswith(
        "limits.timeoutMs = 3000 (set by profile:brief@1): the run worked "
    )
    event = LoopEvent.objects.get(run=run, type="harness.limit_reached")
    assert (event.data["setting"], event.data["layer"]) == ("limits.timeoutMs", "profile:brief@1")
    assert 2.9 <= event.data["worked_seconds"] <= 20
    assert LoopStep.objects.filter(run=run, role="maker", kind="tool").count() >= 3
    # Stopped in the middle of a step: whatever write was in flight ended cleanly.
    assert not LoopStep.objects.filter(run=run, status="started", kind="model").exists()
    assert "Traceback" not in "".join(w.log() for w in workers)

"""Limits with real worker processes (docs/reliability.md P4, and the pattern circuit breaker).

P4: the production AgentInvoker drives runs whose maker never stops calling tools, against a
scripted model served over loopback HTTP (every call 500 tokens and $0.025). A per-run budget
(tool calls, tokens or cost) stops the run in ``blocked`` naming the budget, with no more than
one call of overshoot; an operator raises the budget over the API, resumes, and the run
finishes. Two runs of one pattern in parallel (two workers) share a daily budget: together they
overshoot it by one call at most, and the pattern refuses new triggers until the day is over.

The breaker: three runs rejected by the verifier trip a pattern with failureThreshold 3; the
next trigger gets a 409 naming the breaker.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from loops.models import LoopEvent, LoopPattern, LoopRun, LoopStep, RunStatus, UsageBucket
from loops.services.budget_rules import daily_scope, run_scope
from loops.services.patterns import pattern_create
from orchestrator.agents.services import employee_create, model_endpoint_create
from tests.e2e.conftest import start_worker
from tests.support.limits import PASS, PLAN, role_of
from tests.support.model_server import Completion, Delay, ModelServer, RecordedRequest
from tests.support.workers import WorkerProcess, wait_for

# Seeded again rather than serialized_rollback: a serialized test that follows a plain
# transactional one on the same xdist worker fails its setup (content types exist twice).
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
    pytest.mark.timeout(900),
]
AGENT = {"LOOPWRIGHT_INVOKER": "loops.worker.invoker.AgentInvoker"}
WAIT = 240  # generous: the machine is shared and loaded; the assertions stay strict
CALL_TOKENS, CALL_COST = 500, Decimal("0.025")
LEADER, MAKER, VERIFIER = "limits-leader", "limits-maker", "limits-verifier"


class EndlessMaker:
    """The loopback model's script: the leader plans, the verifier passes, the maker calls a
    new tool (alternating ``read`` and ``list``, fresh arguments each time) at every step until
    ``stop`` is set, then answers."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        #: Seconds each maker call takes (so that parallel runs really overlap).
        self.latency = 0.0

    def __call__(self, request: RecordedRequest) -> Completion | Delay:
        reply = self.reply(request)
        return Delay(self.latency, reply) if self.latency else reply

    def reply(self, request: RecordedRequest) -> Completion:
        messages = request.body["messages"]
        role = role_of(messages)
        if role == "leader":
            return Completion(content=json.dumps(PLAN), usage=(400, 100))
        if role == "verifier":
            return Completion(content=json.dumps(PASS), usage=(400, 100))
        if self.stop.is_set():
            return Completion(content="Done probing.", usage=(400, 100))
        made = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
        call = ("read", {"path": f"f{made}.txt"}) if made % 2 else ("list", {"path": f"d{made}"})
        return Completion(tool_calls=[(call[0], json.dumps(call[1]))], usage=(400, 100))


@pytest.fixture
def script() -> EndlessMaker:
    return EndlessMaker()


@pytest.fixture
def model(script: EndlessMaker) -> Iterator[ModelServer]:
    with ModelServer() as server:
        server.always(script)
        yield server
    server.check()


@pytest.fixture
def team(model: ModelServer) -> None:
    # $0.00005 a token: a call of 400 + 100 tokens costs $0.025.
    endpoint = model_endpoint_create(
        name="limits-loopback",
        provider="openai",
        base_url=model.url,
        model="limits-script",
        max_retries=1,
        timeout_seconds=60,
        input_price_per_token=Decimal("0.00005"),
        output_price_per_token=Decimal("0.00005"),
    )
    for username in (LEADER, MAKER, VERIFIER):
        employee_create(username=username, endpoint=endpoint, tools=["read", "list"], max_steps=200)


def limits_pattern(key: str, policy: dict[str, Any]) -> LoopPattern:
    return pattern_create(
        key=key,
        actor="test",
        goal_template="Probe the workspace forever.",
        leader_username=LEADER,
        maker_usernames=[MAKER],
        verifier_username=VERIFIER,
        policy=policy,
    )


def trigger(client: APIClient, key: str) -> Any:
    return client.post(f"/api/v1/patterns/{key}/trigger", {}, format="json")


def wait_status(run_ids: list[str], wanted: str, workers: list[WorkerProcess]) -> None:
    def statuses() -> list[str]:
        return list(LoopRun.objects.filter(id__in=run_ids).values_list("status", flat=True))

    wait_for(
        lambda: statuses() == [wanted] * len(run_ids),
        timeout=WAIT,
        interval=0.3,
        message=f"{statuses()}\n" + "\n".join(w.log()[-3000:] for w in workers),
    )


def own_broker() -> dict[str, str]:
    """Two workers consuming one kombu ``filesystem://`` broker can crash on a half-written
    message (tests/e2e/test_durability_filesystem_broker.py); on the embedded default each
    worker gets a private in-memory broker instead and finds its run by polling the database,
    which is what this test is about. With Redis both share the real broker."""
    if settings.CELERY_BROKER_URL.startswith("filesystem://"):
        return {"CELERY_BROKER_URL": "memory://"}
    return {}


def usage(scope: str, metric: str) -> Decimal:
    row = UsageBucket.objects.filter(scope=scope, metric=metric).first()
    return Decimal(row.value) if row else Decimal(0)


def tool_steps(run_ids: list[str]) -> int:
    """Tool calls that started (and so may have run): every one is a counted step."""
    return LoopStep.objects.filter(run_id__in=run_ids, kind="tool").count()


# --- P4: a per-run budget -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metric", "limit", "raised"),
    [("toolCalls", 20, 30), ("tokens", 10_000, 20_000), ("cost", 0.5, 1.0)],
)
def test_a_run_that_loops_forever_is_blocked_by_its_budget_then_raised_and_resumed(
    metric: str,
    limit: float,
    raised: float,
    team: None,
    script: EndlessMaker,
    tmp_path: Path,
    workers: list[WorkerProcess],
    api_client_for: Callable[[str], APIClient],
) -> None:
    limits_pattern(f"p4-{metric.lower()}", {"budgets": {"perRun": {metric: limit}}})
    start_worker(workers, tmp_path, "limits", **AGENT)
    operator = api_client_for("operator")
    response = trigger(operator, f"p4-{metric.lower()}")
    assert response.status_code == 201, response.content
    run_id = response.json()["id"]
    wait_status([run_id], RunStatus.BLOCKED, workers)

    run = LoopRun.objects.get(pk=run_id)
    assert run.terminal_reason == f"budget_exhausted:{metric}"
    assert run.failure_reason.startswith(f"per-run budget {metric} exhausted (")
    event = LoopEvent.objects.get(run=run, type="budget.exhausted")
    assert (event.data["scope"], event.data["metric"]) == (run_scope(run.pk), metric)
    assert event.data["limit"] == limit and event.data["used"] >= limit
    model_calls = LoopStep.objects.filter(run=run, kind="model").count()
    tokens, cost = usage(run_scope(run.pk), "tokens"), usage(run_scope(run.pk), "cost")
    assert tokens == CALL_TOKENS * model_calls and cost == CALL_COST * model_calls
    if metric == "toolCalls":
        assert tool_steps([run_id]) == limit  # the 21st call was refused, not started
    elif metric == "tokens":
        assert limit <= tokens <= limit + CALL_TOKENS  # overshoot: one call at most
    else:
        assert Decimal(str(limit)) <= cost <= Decimal(str(limit)) + CALL_COST

    detail = operator.get(f"/api/v1/runs/{run_id}").json()
    assert detail["terminal_reason"] == f"budget_exhausted:{metric}"
    assert detail["budget_usage"]["perRun"][metric]["limit"] == limit
    body = {"perRun": {metric: raised}}
    assert operator.post(f"/api/v1/runs/{run_id}/budget", body, format="json").status_code == 200
    script.stop.set()  # the maker finishes at its next step
    resumed = operator.post(f"/api/v1/runs/{run_id}/resume", {}, format="json")
    assert resumed.status_code == 200, resumed.content
    wait_status([run_id], RunStatus.SUCCEEDED, workers)
    run.refresh_from_db()
    assert (run.terminal_reason, run.failure_reason) == ("verified", "")
    assert LoopEvent.objects.filter(run=run, type="budget.raised").count() == 1


# --- P4: two runs sharing a daily budget ---------------------------------------------------


@pytest.mark.parametrize(("metric", "limit"), [("toolCalls", 20), ("tokens", 10_000)])
def test_two_runs_in_parallel_overshoot_a_shared_daily_budget_by_one_call_at_most(
    metric: str,
    limit: int,
    team: None,
    script: EndlessMaker,
    tmp_path: Path,
    workers: list[WorkerProcess],
    api_client_for: Callable[[str], APIClient],
) -> None:
    key = f"p4-daily-{metric.lower()}"
    pattern = limits_pattern(key, {"budgets": {"daily": {metric: limit}}})
    script.latency = 0.05
    env = {"LOOPWRIGHT_DRIVER_CAPACITY": "1", **AGENT, **own_broker()}
    for name in ("daily-a", "daily-b"):  # one run each: two processes share the budget
        start_worker(workers, tmp_path, name, **env)
    operator = api_client_for("operator")
    run_ids = [trigger(operator, key).json()["id"] for _ in range(2)]
    wait_status(run_ids, RunStatus.BLOCKED, workers)

    claims = LoopEvent.objects.filter(run_id__in=run_ids, type="lease.claimed")
    assert len({(e.run_id, e.actor) for e in claims}) == len({e.actor for e in claims}) == 2
    scope = daily_scope(pattern.pk, datetime.now(UTC))
    for run in LoopRun.objects.filter(id__in=run_ids):
        assert run.terminal_reason == f"budget_exhausted:{metric}"
        assert run.failure_reason.startswith(f"daily budget {metric} exhausted (")
        assert LoopStep.objects.filter(run=run, kind="tool").exists(), "both runs worked"
    total = usage(scope, metric)
    if metric == "toolCalls":
        assert total == limit == tool_steps(run_ids)  # counted exactly: no overshoot at all
    else:
        model_calls = LoopStep.objects.filter(run_id__in=run_ids, kind="model").count()
        assert total == CALL_TOKENS * model_calls
        assert limit <= total <= limit + CALL_TOKENS, f"{model_calls} calls: {total} tokens"
    refused = trigger(operator, key)
    assert refused.status_code == 409
    assert f"daily budget {metric} exhausted" in refused.json()["detail"]


# --- the pattern circuit breaker -----------------------------------------------------------


def test_three_failed_runs_trip_the_breaker_and_the_next_trigger_is_refused(
    tmp_path: Path, workers: list[WorkerProcess], api_client_for: Callable[[str], APIClient]
) -> None:
    pattern_create(
        key="flaky",
        actor="test",
        goal_template="Fail, as the verifier says.",
        leader_username="lead",
        maker_usernames=["make"],
        verifier_username="check",
        policy={"circuitBreaker": {"failureThreshold": 3, "cooldownSeconds": 600}},
    )
    start_worker(workers, tmp_path, "breaker", LW_TEST_VERDICT="reject", LW_TEST_STEPS="1")
    operator = api_client_for("operator")
    run_ids = []
    for _ in range(3):
        response = trigger(operator, "flaky")
        assert response.status_code == 201, response.content
        run_ids.append(response.json()["id"])
    wait_status(run_ids, RunStatus.FAILED, workers)
    assert set(
        LoopRun.objects.filter(id__in=run_ids).values_list("terminal_reason", flat=True)
    ) == {"rejected_by_verifier"}

    refused = trigger(operator, "flaky")
    assert refused.status_code == 409
    body = refused.json()
    assert "circuit breaker open after 3 consecutive failed runs; retry after" in body["detail"]
    assert body["breaker_state"] == "open" and body["breaker_open_until"].endswith("Z")
    assert LoopRun.objects.filter(pattern__key="flaky").count() == 3
    retried = operator.post(f"/api/v1/runs/{run_ids[0]}/retry", {}, format="json")
    assert retried.status_code == 409

"""docs/reliability.md P2 for the agent runtime: canary secrets never leak.

Two random canaries are planted as the API keys of a model endpoint and of its failover (only
environment variables hold them). The loopback provider sees them in the Authorization header
and turns hostile: it echoes the key in error bodies and headers, and, playing the model, puts
both keys in its text, in tool arguments (a ``read`` of a path naming the key, so the tool's
error message carries it too, and a gated ``write`` whose content is the key) and in a
verdict. Runs go through the real engine in this process, the production AgentInvoker and the
real tools, with every logger at DEBUG.

Pass: 0 canary occurrences in the captured logs, the database rows (steps, events, runs,
approvals, breaker state, artifacts) and the REST API's responses for those runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from django.db import DEFAULT_DB_ALIAS, connections
from django.forms.models import model_to_dict

from loops.models import ActionApproval, CircuitState, LoopEvent, LoopRun, LoopStep, RunStatus
from loops.services.claims import run_claim
from loops.services.runs import run_trigger
from loops.worker.engine import drive_run
from loops.worker.invoker import AgentInvoker
from orchestrator.agents.models import EndpointCircuit
from orchestrator.agents.services import FailoverSpec, employee_create, model_endpoint_create
from runtime.tools import DirectoryLedger, FileToolConfig, builtin_registry
from tests.support.approvals import (
    PLAN,
    InlineDriver,
    approval_pattern,
    inputs_of,
    role_of,
    tool_results,
)
from tests.support.model_server import Completion, Error, ModelServer, RecordedRequest

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
    pytest.mark.timeout(600),
]

LEADER, MAKER, VERIFIER = "p2-leader", "p2-maker", "p2-verifier"
PRIMARY_ENV, FAILOVER_ENV = "LOOPWRIGHT_SECRET_P2_PRIMARY_KEY", "LOOPWRIGHT_SECRET_P2_FAILOVER_KEY"


class HostileProvider:
    """Sees the key in each request and leaks it every way it can, per the run's ``mode``."""

    def __init__(self) -> None:
        self.failed_once: set[str] = set()

    def __call__(self, request: RecordedRequest) -> Any:
        key = request.headers.get("authorization", "").removeprefix("Bearer ")
        messages = request.body["messages"]
        role = role_of(messages)
        mode = inputs_of(messages).get("mode", "")
        label = inputs_of(messages).get("label", "")
        echo = {"error": {"message": f"Incorrect API key provided: {key}", "key": key}}
        if mode == "unauthorized":
            return Error(401, echo, {"X-Echo": f"Bearer {key}"})
        if mode == "flaky" and label not in self.failed_once:
            self.failed_once.add(label)  # one 500 echoing the key, then the retry succeeds
            return Error(500, echo, {"X-Echo": f"Bearer {key}"})
        if role == "leader":
            return Completion(content=json.dumps({**PLAN, "note": f"my key is {key}"}))
        if role == "verifier":
            verdict = {"verdict": "pass", "reasons": [f"key {key} works"], "checks": []}
            return Completion(content=json.dumps(verdict))
        if not tool_results(messages):
            return _calls(
                ("read", {"path": f"keys/{key}.txt"}),
                ("write", {"path": "leak.txt", "content": f"stolen: {key}"}),
                ("list", {"path": key}),
            )
        return Completion(content=f"Done; the key was {key}. " + " | ".join(tool_results(messages)))


def _calls(*calls: tuple[str, dict[str, Any]]) -> Completion:
    wire = [
        {
            "id": f"call_{uuid.uuid4().hex[:8]}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)},
        }
        for name, args in calls
    ]
    return Completion(
        content=f"Calling tools ({wire[0]['function']['arguments']})", tool_calls=wire
    )


@pytest.fixture
def canaries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    planted = [f"sk-canary-{secrets.token_hex(16)}", f"sk-canary-{secrets.token_hex(16)}"]
    monkeypatch.setenv(PRIMARY_ENV, planted[0])
    monkeypatch.setenv(FAILOVER_ENV, planted[1])
    return planted


@pytest.fixture
def servers() -> Iterator[tuple[ModelServer, ModelServer]]:
    with ModelServer() as primary, ModelServer() as failover:
        primary.always(HostileProvider())
        failover.always(HostileProvider())
        yield primary, failover


@pytest.fixture
def pattern(servers: tuple[ModelServer, ModelServer], canaries: list[str]) -> Any:
    primary, failover = servers
    backup = model_endpoint_create(
        name="p2-failover",
        provider="openai",
        base_url=failover.url,
        model="hostile",
        api_key_env=FAILOVER_ENV,
        max_retries=0,
    )
    endpoint = model_endpoint_create(
        name="p2-primary",
        provider="openai",
        base_url=primary.url,
        model="hostile",
        api_key_env=PRIMARY_ENV,
        max_retries=1,
        failover=[FailoverSpec(target=backup)],
    )
    tools = ["read", "list", "write"]
    for username in (LEADER, MAKER, VERIFIER):
        employee_create(username=username, endpoint=endpoint, tools=tools)
    return approval_pattern(
        "p2-secrets", leader_username=LEADER, maker_usernames=[MAKER], verifier_username=VERIFIER
    )


def drive(invoker: AgentInvoker, run_id: uuid.UUID) -> None:
    [claim] = run_claim(owner="p2-engine", lease_seconds=300, run_id=run_id)
    outer = connections[DEFAULT_DB_ALIAS]

    async def main() -> None:
        connections[DEFAULT_DB_ALIAS] = outer
        await drive_run(InlineDriver(invoker), claim)  # type: ignore[arg-type]

    with mock.patch.dict(os.environ, {"DJANGO_ALLOW_ASYNC_UNSAFE": "true"}):
        asyncio.run(main())


def _rows(run_ids: list[uuid.UUID]) -> str:
    dumps = []
    for model in (LoopStep, LoopEvent, ActionApproval):
        for row in model.objects.filter(run_id__in=run_ids):
            dumps.append(json.dumps(model_to_dict(row), default=str))
    for run in LoopRun.objects.filter(id__in=run_ids):
        dumps.append(json.dumps(model_to_dict(run), default=str))
    for state in [*CircuitState.objects.all(), *EndpointCircuit.objects.all()]:
        dumps.append(json.dumps(model_to_dict(state), default=str))
    return "\n".join(dumps)


def _api(client: Any, run_ids: list[uuid.UUID]) -> str:
    bodies = []
    paths = ["/api/v1/model-endpoints", "/api/v1/employees", "/api/v1/approvals"]
    for run_id in run_ids:
        paths += [f"/api/v1/runs/{run_id}", f"/api/v1/runs/{run_id}/steps"]
        paths += [f"/api/v1/runs/{run_id}/events", f"/api/v1/runs/{run_id}/artifacts"]
    for path in paths:
        response = client.get(path)
        assert response.status_code == 200, (path, response.status_code)
        bodies.append(response.content.decode())
    return "\n".join(bodies)


def test_canary_keys_never_reach_logs_rows_or_api_responses(
    tmp_path: Path,
    pattern: Any,
    canaries: list[str],
    servers: tuple[ModelServer, ModelServer],
    caplog: pytest.LogCaptureFixture,
    api_client_for: Any,
) -> None:
    caplog.set_level(logging.DEBUG)
    ledger = DirectoryLedger(tmp_path / "ledger")
    invoker = AgentInvoker(tools=builtin_registry(FileToolConfig(ledger=ledger)))
    modes = ["leaky", "flaky", "unauthorized"]
    runs = {
        mode: run_trigger(pattern=pattern, actor="operator", inputs={"label": mode, "mode": mode})
        for mode in modes
    }
    for run in runs.values():
        drive(invoker, run.id)
    run_ids = [run.id for run in runs.values()]

    # The hostile provider did get the keys and did try to leak them.
    seen = [r.headers.get("authorization", "") for s in servers for r in s.requests]
    assert f"Bearer {canaries[0]}" in seen and f"Bearer {canaries[1]}" in seen
    statuses = {mode: LoopRun.objects.get(pk=run.id).status for mode, run in runs.items()}
    assert statuses["leaky"] == RunStatus.WAITING_APPROVAL  # the gated write of the key
    assert statuses["flaky"] == RunStatus.WAITING_APPROVAL
    assert statuses["unauthorized"] == RunStatus.FAILED
    assert LoopStep.objects.filter(run_id__in=run_ids, kind="tool").count() >= 6

    logs = "\n".join(
        [caplog.text] + [f"{r.getMessage()} {r.exc_text or ''} {r.args!r}" for r in caplog.records]
    )
    rows = _rows(run_ids)
    api = _api(api_client_for("admin"), run_ids)
    for canary in canaries:
        assert canary not in logs, "canary in the logs"
        assert canary not in rows, "canary in database rows"
        assert canary not in api, "canary in API responses"
    assert "***" in rows  # what was scrubbed is marked, not silently dropped

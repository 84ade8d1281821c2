"""An employee's daily token quota binds its runs: a run whose maker has used it up stops with a
budget stop naming the quota, before the next model call (the chat side:
tests/gateway/test_chat_quota.py). The production invoker, a model over loopback HTTP."""

from __future__ import annotations

import pytest

from loops.models import LoopRun, RunStatus
from loops.services.runs import run_trigger
from orchestrator.agents.models import EmployeeUsageDay
from orchestrator.agents.services import employee_create, model_endpoint_create
from tests.support.approvals import (
    LEADER,
    MAKER,
    VERIFIER,
    approval_pattern,
    drive_production,
    role_of,
)
from tests.support.model_server import ModelServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


@pytest.mark.usefixtures("seeded_profiles")
def test_a_run_stops_when_its_employee_is_out_of_quota(role_model: ModelServer) -> None:
    endpoint = model_endpoint_create(
        name="quota-loopback", provider="openai", base_url=role_model.url, model="quota-script",
        max_retries=0, timeout_seconds=60,
    )  # fmt: skip
    employee_create(username=LEADER, endpoint=endpoint, tools=["list"])
    employee_create(username=MAKER, endpoint=endpoint, tools=["list"], daily_token_quota=12)
    employee_create(username=VERIFIER, endpoint=endpoint, tools=["list"])
    inputs = {"label": "quota", "rounds": [[["list", {"path": "."}]]]}
    run = run_trigger(pattern=approval_pattern("quota"), actor="alice", inputs=inputs)

    assert drive_production(run.id) == RunStatus.BLOCKED
    stopped = LoopRun.objects.get(pk=run.id)
    assert stopped.terminal_reason == "quota:employee:tokens"
    assert f'employee "{MAKER}" has used its daily tokens quota (12; 15 today)' in (
        stopped.failure_reason
    )
    maker_calls = [b for b in role_model.bodies if role_of(b["messages"]) == "maker"]
    assert len(maker_calls) == 1  # the second model call was never made
    assert EmployeeUsageDay.objects.get(username=MAKER).tokens == 15
    assert not EmployeeUsageDay.objects.filter(username=LEADER).exists()  # no quota: not counted

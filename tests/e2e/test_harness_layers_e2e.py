"""The employee's layer and the run's overrides from outside: a run triggered over the API is
driven by a real worker process with the production AgentInvoker against a scripted model served
over loopback HTTP (any OpenAI-compatible model would do).

The maker's own inline layer denies ``write``: its proposed write is a refused tool call the
model is told about (visible in the run's steps), not a call waiting for a human, and the run
goes on to its verdict. The run's override asks for more invocations than the maker's profile
allows: the maker gets the profile's value, and the trigger's answer says so.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from harness.services import profile_create
from loops.models import ActionApproval, LoopEvent, LoopRun, LoopStep, RunStatus
from orchestrator.agents.models import Employee
from orchestrator.agents.services import employee_update
from tests.e2e.conftest import start_worker
from tests.support.approvals import MAKER, approval_pattern, http_reply, loopback_team, write_call
from tests.support.model_server import ModelServer
from tests.support.workers import WorkerProcess, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
    pytest.mark.timeout(600),
]
AGENT = {"LOOPWRIGHT_INVOKER": "loops.worker.invoker.AgentInvoker"}
WAIT = 240  # generous: the machine is shared and loaded; the assertions stay strict
ENDED = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.WAITING_APPROVAL, RunStatus.WAITING_HUMAN)


@pytest.fixture
def model() -> Iterator[ModelServer]:
    with ModelServer() as server:
        server.always(http_reply)
        yield server
    server.check()


@pytest.fixture
def worker(
    tmp_path: Path, workers: list[WorkerProcess], model: ModelServer
) -> Iterator[WorkerProcess]:
    loopback_team(model.url, "layers")
    profile_create(tag="capped", settings={"limits": {"maxInvocations": 5}})
    employee_update(
        employee=Employee.objects.get(username=MAKER), harness={"tools": {"deny": ["write"]}}
    )
    approval_pattern("layers-e2e", maker_harness_tag="capped")
    yield start_worker(workers, tmp_path, "layers", **AGENT)


def test_the_makers_own_deny_refuses_its_write_in_a_real_run(
    worker: WorkerProcess, api_client_for: Any
) -> None:
    operator: APIClient = api_client_for("operator")
    inputs = {"label": "e2e", "rounds": [[list(write_call("notes.txt", "hello"))]]}
    overrides = {"limits": {"maxInvocations": 99}}
    response = operator.post(
        "/api/v1/patterns/layers-e2e/trigger",
        {"inputs": inputs, "harness_overrides": overrides},
        format="json",
    )
    assert response.status_code == 201, response.content
    run_id = response.json()["id"]
    maker_notice = {
        "role": "maker", "employee": MAKER, "field": "limits.maxInvocations", "asked": 99,
        "got": 5, "decidedBy": "profile:capped@1",
    }  # fmt: skip
    assert maker_notice in response.json()["harness_notices"]

    wait_for(
        lambda: LoopRun.objects.get(pk=run_id).status in ENDED,
        timeout=WAIT,
        interval=0.5,
        message=worker.log()[-4000:],
    )
    run = LoopRun.objects.get(pk=run_id)
    assert run.status == RunStatus.SUCCEEDED, (run.status, run.failure_reason, worker.log()[-3000:])
    maker = run.harness_snapshots["makers"][MAKER]
    assert maker["layers"] == [
        "platform",
        "profile:capped@1",
        f"employee:{MAKER}",
        "run",
    ]
    assert maker["provenance"]["tools.deny"] == f"employee:{MAKER}"
    assert maker["settings"]["limits"]["maxInvocations"] == 5

    step = LoopStep.objects.get(run=run, role="maker", kind="tool", name="write")
    assert step.status != "completed"
    assert "not permitted" in step.error and "tools.deny" in step.error, step.error
    assert not ActionApproval.objects.filter(run=run).exists()
    # The model was told: its final answer reports the refusal it was given as the result.
    answer = LoopStep.objects.filter(run=run, role="maker", kind="model").order_by("-seq").first()
    assert answer is not None and "not permitted" in str(answer.response)
    created = LoopEvent.objects.get(run=run, type="run.created")
    assert maker_notice in created.data["overrides_not_applied"]

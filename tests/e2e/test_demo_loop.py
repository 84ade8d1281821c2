"""The product's core promise end to end, with a real worker and the scripted model: the
leader plans, the maker edits a file in the run's worktree and proposes a gated write, the run
waits, a human approves (optionally editing the input), the verifier passes, the diff is an
artifact."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from loops.models import ActionApproval, LoopArtifact, LoopRun, RunStatus
from tests.e2e.conftest import start_worker
from tests.support.workers import WorkerProcess, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
]
AGENT = {"LOOPWRIGHT_INVOKER": "loops.worker.invoker.AgentInvoker"}


def status_of(run_id: str) -> str:
    return LoopRun.objects.get(pk=run_id).status


@pytest.fixture
def demo_run(
    tmp_path: Path, workers: list[WorkerProcess], api_client_for: Callable[[str], APIClient]
) -> str:
    call_command("seed_demo", "--no-run", verbosity=0)
    start_worker(workers, tmp_path, "agent", **AGENT)
    operator = api_client_for("operator")
    response = operator.post(
        "/api/v1/patterns/demo-hello/trigger", {"inputs": {"path": "hello.txt"}}, format="json"
    )
    assert response.status_code == 201, response.content
    run_id = response.json()["id"]
    wait_for(
        lambda: status_of(run_id) == RunStatus.WAITING_APPROVAL,
        timeout=120,
        message=workers[0].log()[-4000:],
    )
    return run_id


def test_the_demo_loop_parks_for_approval_and_finishes_after_it(
    demo_run: str, workers: list[WorkerProcess], api_client_for: Callable[[str], APIClient]
) -> None:
    approver = api_client_for("approver")
    pending = approver.get(f"/api/v1/approvals?status=pending&run={demo_run}").json()["results"]
    assert [a["tool_name"] for a in pending] == ["write"]
    assert pending[0]["reason"] and pending[0]["role"] == "maker"
    assert LoopRun.objects.get(pk=demo_run).lease_owner is None  # parked: holds no worker
    edited = {"path": "hello.txt", "content": "Hello, wonderful world.\n"}
    decided = approver.post(
        f"/api/v1/approvals/{pending[0]['id']}/decide",
        {"decision": "approve", "input": edited},
        format="json",
    )
    assert decided.status_code == 200, decided.content
    wait_for(
        lambda: status_of(demo_run) == RunStatus.SUCCEEDED,
        timeout=120,
        message=workers[0].log()[-4000:],
    )
    run = LoopRun.objects.get(pk=demo_run)
    assert run.terminal_reason == "verified"
    diff = LoopArtifact.objects.get(run=run, kind="diff").content
    assert "+Hello, wonderful world." in diff and "-Hello, world." in diff
    approval = ActionApproval.objects.get(pk=pending[0]["id"])
    assert approval.executed_hash == approval.approved_hash != ""
    again = approver.post(
        f"/api/v1/approvals/{approval.id}/decide", {"decision": "reject"}, format="json"
    )
    assert again.status_code == 409


def test_a_rejection_reaches_the_model_and_the_run_goes_on(
    demo_run: str, workers: list[WorkerProcess], api_client_for: Callable[[str], APIClient]
) -> None:
    approver = api_client_for("approver")
    [pending] = approver.get(f"/api/v1/approvals?run={demo_run}").json()["results"]
    viewer = api_client_for("viewer")
    assert (
        viewer.post(
            f"/api/v1/approvals/{pending['id']}/decide", {"decision": "approve"}, format="json"
        ).status_code
        == 403
    )
    response = approver.post(
        f"/api/v1/approvals/{pending['id']}/decide",
        {"decision": "reject", "reason": "not this file"},
        format="json",
    )
    assert response.status_code == 200
    wait_for(
        lambda: (
            LoopRun.objects.get(pk=demo_run).status
            in (RunStatus.SUCCEEDED, RunStatus.WAITING_HUMAN, RunStatus.FAILED)
        ),
        timeout=120,
        message=workers[0].log()[-4000:],
    )
    step = LoopRun.objects.get(pk=demo_run).steps.get(seq=pending["step_seq"])
    assert (
        step.status == "completed"
        and "Rejected by approver: not this file" in step.response["content"]
    )
    assert not LoopArtifact.objects.filter(run_id=demo_run, kind="diff").exists()


def test_edited_input_that_breaks_the_tool_schema_is_refused(
    demo_run: str, api_client_for: Callable[[str], APIClient]
) -> None:
    approver = api_client_for("approver")
    [pending] = approver.get(f"/api/v1/approvals?run={demo_run}").json()["results"]
    response = approver.post(
        f"/api/v1/approvals/{pending['id']}/decide",
        {"decision": "approve", "input": {"path": 3}},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["errors"][0]["pointer"].startswith("/input")
    assert ActionApproval.objects.get(pk=pending["id"]).status == "pending"

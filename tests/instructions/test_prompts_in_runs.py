"""End to end: prompts with ``${instructions.x}``, ``${include()}`` and ``${var}`` in real runs.

Runs are driven in this process by the real engine with the production invoker
(``AgentInvoker``) against the scripted model on loopback HTTP; what the model received is read
from the server's recorded requests. A run pins the instruction versions it starts with: one
that resumes after v2 is published keeps v1, the next run gets v2, a retry keeps its run's.
An include of a missing workspace file fails the invocation before any model call, naming the
path; a reference to an instruction never published refuses the trigger (400).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from instructions.services import instruction_create, instruction_publish, instruction_save_draft
from loops.models import LoopPattern, LoopRun, RunStatus
from loops.services.runs import run_trigger
from orchestrator.accounts.services import user_ensure
from orchestrator.agents.models import Employee
from orchestrator.agents.services import employee_create, model_endpoint_create
from orchestrator.errors import InvalidInput
from tests.conftest import PERSONAS
from tests.support.approvals import (
    LEADER,
    MAKER,
    VERIFIER,
    approval_pattern,
    drive_production,
    pending_approvals,
    role_of,
)
from tests.support.model_server import ModelServer
from tests.support.repos import committed_repository

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
    pytest.mark.timeout(300),
]
TONE_1, TONE_2 = "Answer in plain words.", "Answer in haiku."


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    return committed_repository(
        tmp_path / "repo", {"IDENTITY.md": "You are the Tidewater release team.\n"}
    )


@pytest.fixture
def employees(role_model: ModelServer) -> None:
    endpoint = model_endpoint_create(
        name="prompts-loopback", provider="openai", base_url=role_model.url, model="prompts-script",
        max_retries=0, timeout_seconds=60,
    )  # fmt: skip
    instruction_create(name="tone", text=TONE_1, created_by="tester")
    instruction_publish(name="tone", published_by="tester")
    employee_create(username=LEADER, endpoint=endpoint, tools=["read", "list"],
                    system_prompt='${include("IDENTITY.md")}Ticket ${inputs.label}.')  # fmt: skip
    employee_create(username=MAKER, endpoint=endpoint, tools=["memory_save"],
                    system_prompt="Maker. ${instructions.tone}")  # fmt: skip
    employee_create(username=VERIFIER, endpoint=endpoint, tools=["read"],
                    system_prompt="Verifier. ${instructions.tone} Also: ${instructions.tone@1}")  # fmt: skip


def trigger(pattern: LoopPattern, label: str, **fields: Any) -> LoopRun:
    save = [["memory_save", {"content": f"fact of {label}"}]]
    inputs = {"label": label, "rounds": [save]}
    return run_trigger(pattern=pattern, actor="alice", inputs=inputs, **fields)


def system_prompts(role_model: ModelServer, label: str, role: str) -> list[str]:
    found = [
        str(body["messages"][0]["content"])
        for body in role_model.bodies
        if role_of(body["messages"]) == role and f"Approvals test {label}" in json.dumps(body)
    ]
    return found


def approve(run: LoopRun, api_client_for: Callable[[str], APIClient]) -> None:
    [approval] = pending_approvals(run)
    decided = api_client_for("approver").post(
        f"/api/v1/approvals/{approval.id}/decide", {"decision": "approve"}, format="json"
    )
    assert decided.status_code == 200, decided.content


def test_a_run_keeps_the_versions_it_started_with(
    role_model: ModelServer,
    employees: None,
    repository: Path,
    api_client_for: Callable[[str], APIClient],
) -> None:
    pattern = approval_pattern("prompts", repository_root=str(repository), base_ref="main")
    first = trigger(pattern, "first")
    assert first.instruction_versions == {"tone": 1}
    assert drive_production(first.id) == RunStatus.WAITING_APPROVAL
    [leader] = system_prompts(role_model, "first", "leader")
    assert leader.startswith("You are the Tidewater release team.\nTicket first.")
    assert system_prompts(role_model, "first", "maker")[0].startswith(f"Maker. {TONE_1}")

    # v2 is published while the run waits; the run resumes with v1, the next run gets v2.
    instruction_save_draft(name="tone", text=TONE_2, created_by="tester")
    instruction_publish(name="tone", published_by="tester")
    approve(first, api_client_for)
    assert drive_production(first.id) == RunStatus.SUCCEEDED
    [verifier] = system_prompts(role_model, "first", "verifier")
    assert verifier.startswith(f"Verifier. {TONE_1} Also: {TONE_1}")
    run = api_client_for("viewer").get(f"/api/v1/runs/{first.id}").json()
    assert run["instruction_versions"] == {"tone": 1}
    page = Client()
    page.force_login(user_ensure(username="viewer", roles=PERSONAS["viewer"]))
    shown = page.get(f"/runs/{first.id}").content.decode()
    assert '<a class="mono" href="/instructions/tone?version=1">tone@1</a>' in shown
    assert "write tier</span>" in shown  # the maker's memory_save, a write
    assert "memory_save (write)" in shown  # the tools its model steps were listed

    second = trigger(pattern, "second")
    assert second.instruction_versions == {"tone": 2}
    assert drive_production(second.id) == RunStatus.WAITING_APPROVAL
    assert system_prompts(role_model, "second", "maker")[0].startswith(f"Maker. {TONE_2}")
    again = trigger(pattern, "again", retry_of=first)
    assert again.instruction_versions == {"tone": 1}


def test_an_include_of_a_missing_file_fails_before_any_model_call(
    role_model: ModelServer, employees: None, repository: Path
) -> None:
    Employee.objects.filter(username=LEADER).update(
        system_prompt='${include("docs/SOUL.md")} Lead.'
    )
    pattern = approval_pattern("missing", repository_root=str(repository), base_ref="main")
    run = trigger(pattern, "missing")
    assert drive_production(run.id) == RunStatus.FAILED
    assert role_model.bodies == []
    failed = LoopRun.objects.get(pk=run.id)
    assert 'include("docs/SOUL.md")' in failed.failure_reason, failed.failure_reason
    assert "no such file" in failed.failure_reason
    assert failed.terminal_reason == "prompt_template"


def test_a_reference_to_an_unpublished_instruction_refuses_the_trigger(employees: None) -> None:
    instruction_create(name="escalation", text="Call the on-call lead.", created_by="tester")
    Employee.objects.filter(username=MAKER).update(system_prompt="${instructions.escalation}")
    pattern = approval_pattern("unpublished")
    with pytest.raises(InvalidInput) as refused:
        trigger(pattern, "never")
    assert 'instruction "escalation" has no published version' in str(refused.value.detail)
    assert not LoopRun.objects.exists()

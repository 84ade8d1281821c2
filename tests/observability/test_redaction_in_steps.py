"""The role's ``observability.redact`` patterns keep a secret-shaped value out of the run's
record of prompts and responses (its steps, its result, its spans), though the model itself was
given it: a file of the workspace holds an AWS-style key that no configuration knows; the maker
reads it and repeats it in its answer. The production invoker, a model over loopback HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.services import profile_create
from loops.models import LoopRun, LoopStep, RunStatus
from loops.services.runs import run_trigger
from loops.span_models import LoopSpan
from orchestrator.agents.services import employee_create, model_endpoint_create
from tests.support.approvals import (
    LEADER,
    MAKER,
    VERIFIER,
    approval_pattern,
    drive_production,
)
from tests.support.model_server import ModelServer
from tests.support.repos import committed_repository

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
    pytest.mark.timeout(300),
]
PLANTED = "AKIAIOSFODNN7EXAMPLE"


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    return committed_repository(
        tmp_path / "repo", {"notes.txt": f"deploy key {PLANTED} (rotate monthly)\n"}
    )


def test_a_planted_secret_is_masked_in_everything_the_run_keeps(
    role_model: ModelServer, repository: Path
) -> None:
    endpoint = model_endpoint_create(
        name="redact-loopback", provider="openai", base_url=role_model.url, model="redact-script",
        max_retries=0, timeout_seconds=60,
    )  # fmt: skip
    for username in (LEADER, MAKER, VERIFIER):
        employee_create(username=username, endpoint=endpoint, tools=["read"])
    profile_create(tag="redacting", settings={"observability": {
        "redact": ["AKIA[0-9A-Z]{16}"], "captureInputs": True, "captureOutputs": True,
    }})  # fmt: skip
    pattern = approval_pattern(
        "redact", repository_root=str(repository), base_ref="main", maker_harness_tag="redacting"
    )
    inputs = {"label": "redact", "rounds": [[["read", {"path": "notes.txt"}]]]}
    run = run_trigger(pattern=pattern, actor="alice", inputs=inputs)
    assert drive_production(run.id) == RunStatus.SUCCEEDED

    assert any(PLANTED in json.dumps(body) for body in role_model.bodies)  # the model was given it
    maker_steps = LoopStep.objects.filter(run=run, invocation__startswith="maker")
    kept = json.dumps(
        [[s.request, s.response, s.error] for s in maker_steps]
        + [LoopRun.objects.get(pk=run.id).result]
        + [[s.attributes for s in LoopSpan.objects.filter(run=run)]],
        default=str,
    )
    assert PLANTED not in kept
    assert "deploy key *** (rotate monthly)" in kept

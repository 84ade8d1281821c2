"""The employee's layers and the run's overrides bind a run driven by the real engine.

The run is triggered through the trigger service and driven in this process by the production
engine (``drive_run``), the real tool loop, the production role policy (``role_tool_policy``
over the run's harness snapshot) and the builtin file tools, with the role-aware scripted model
of tests/support/approvals.py. Under the pattern's ``default`` profile a maker's ``write`` asks a
human (the run parks); a ``tools.deny`` stated by the maker's own profile, its inline settings or
the run's overrides makes the same call a refused tool call the model sees, named in the step,
and the snapshot's provenance names the layer that decided it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.services import profile_create
from loops.models import LoopPattern, LoopRun, LoopStep, RunStatus
from loops.services.runs import run_trigger
from orchestrator.agents.models import Employee
from orchestrator.agents.services import employee_create, employee_update, model_endpoint_create
from tests.support.approvals import (
    LEADER,
    MAKER,
    VERIFIER,
    Engine,
    approval_pattern,
    pending_approvals,
    write_call,
)

pytestmark = pytest.mark.django_db
NO_WRITES = {"tools": {"deny": ["write"]}}


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    return Engine(tmp_path / "ledger")


@pytest.fixture
def pattern(db: None) -> LoopPattern:
    endpoint = model_endpoint_create(name="offline", provider="scripted", script="demo")
    for username in (LEADER, MAKER, VERIFIER):
        employee_create(username=username, endpoint=endpoint, tools=["read", "list", "write"])
    profile_create(tag="no-writes", settings=NO_WRITES)
    return approval_pattern("employee-layers")


def trigger_and_drive(
    engine: Engine, pattern: LoopPattern, overrides: dict[str, Any] | None = None
) -> LoopRun:
    inputs = {"label": "layers", "rounds": [[list(write_call("notes.txt", "hello"))]]}
    run = run_trigger(pattern=pattern, actor="test", inputs=inputs, harness_overrides=overrides)
    engine.drive(run.id)
    return LoopRun.objects.get(pk=run.id)


def maker_write_step(run: LoopRun) -> LoopStep:
    return LoopStep.objects.get(run=run, role="maker", kind="tool", name="write")


def test_without_a_layer_of_its_own_the_makers_write_asks_a_human(
    engine: Engine, pattern: LoopPattern
) -> None:
    run = trigger_and_drive(engine, pattern)
    assert run.status == RunStatus.WAITING_APPROVAL
    assert [a.tool_name for a in pending_approvals(run)] == ["write"]
    maker = run.harness_snapshots["makers"][MAKER]
    assert "write" not in maker["settings"]["tools"]["deny"]
    assert not any(layer.startswith("employee:") for layer in maker["layers"])


@pytest.mark.parametrize(
    ("own_tag", "own_layer", "overrides", "decided_by"),
    [
        ("", NO_WRITES, None, f"employee:{MAKER}"),
        ("no-writes", {}, None, f"employee:{MAKER}:profile:no-writes@1"),
        ("", {}, NO_WRITES, "run"),
    ],
    ids=["employee-inline", "employee-profile", "run-override"],
)
def test_a_deny_in_a_later_layer_refuses_the_makers_write_in_the_run(
    engine: Engine,
    pattern: LoopPattern,
    own_tag: str,
    own_layer: dict[str, Any],
    overrides: dict[str, Any] | None,
    decided_by: str,
) -> None:
    employee_update(
        employee=Employee.objects.get(username=MAKER), harness_tag=own_tag, harness=own_layer
    )
    run = trigger_and_drive(engine, pattern, overrides)

    maker = run.harness_snapshots["makers"][MAKER]
    assert "write" in maker["settings"]["tools"]["deny"]
    assert maker["provenance"]["tools.deny"] == decided_by
    assert decided_by in maker["layers"]
    # The leader and the verifier carry no employee layer: only the maker is tightened.
    leader = run.harness_snapshots["leader"]
    assert not any(layer.startswith("employee:") for layer in leader["layers"])

    # The call was refused (no approval, nothing written), the model was told why, and the run
    # went on to its verdict.
    assert run.status == RunStatus.SUCCEEDED, (run.status, run.failure_reason)
    assert pending_approvals(run) == []
    assert engine.writes_of(run.id) == []
    step = maker_write_step(run)
    assert "not permitted" in step.error and "tools.deny" in step.error, step.error
    maker_requests = engine.model.maker_requests()
    answered = [m for m in maker_requests[-1].messages if m.get("role") == "tool"]
    assert any("not permitted" in str(m.get("content")) for m in answered)
    # The tool was never offered to the maker's model.
    offered = {t["function"]["name"] for t in (maker_requests[0].tools or [])}
    assert "write" not in offered and "read" in offered


def test_the_makers_inline_recursion_limit_ends_its_invocation_naming_the_layer(
    engine: Engine, pattern: LoopPattern
) -> None:
    employee_update(
        employee=Employee.objects.get(username=MAKER), harness={"limits": {"recursionLimit": 1}}
    )
    inputs = {"label": "steps", "rounds": [[["read", {"path": "a.txt"}]], [["list", {}]]]}
    run = run_trigger(pattern=pattern, actor="test", inputs=inputs)
    engine.drive(run.id)
    run.refresh_from_db()

    maker = run.harness_snapshots["makers"][MAKER]
    assert maker["settings"]["limits"]["recursionLimit"] == 1
    assert maker["provenance"]["limits.recursionLimit"] == f"employee:{MAKER}"
    leader = run.harness_snapshots["leader"]
    assert leader["settings"]["limits"]["recursionLimit"] > 1
    # The first round ran; the second never did: the invocation was out of the steps the
    # employee's layer allows.
    tools = LoopStep.objects.filter(run=run, role="maker", kind="tool")
    assert list(tools.values_list("name", flat=True)) == ["read"]
    assert run.status == RunStatus.FAILED, (run.status, run.failure_reason)
    assert run.terminal_reason == "harness_limit:limits.recursionLimit"
    assert f"limits.recursionLimit = 1 (set by employee:{MAKER})" in run.failure_reason

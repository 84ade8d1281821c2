"""The ``limits`` of a role's compiled harness bind a real run through the engine.

Each test compiles the run's snapshots from a profile made here (``profile_create``), as
``run_trigger`` does, and drives the run with the production ``drive_run``, the real tool loop
and the fenced journal (``tests.support.limits.InlineEngine``: only the model and the tools are
doubles), on the database the suite runs on (SQLite or PostgreSQL) and, where the journal's
write path matters, on both of its paths. A harness limit ends the run ``failed`` with
``harness_limit:<setting>`` and names the value and the layer; where it overlaps a per-run
budget the stricter wins, a tie goes to the harness, and the reason says which.
"""

from __future__ import annotations

import itertools
import uuid
from decimal import Decimal
from typing import Any

import pytest

from harness.services import profile_create
from loops.models import LoopEvent, LoopRun, LoopStep, RunStatus, UsageBucket
from loops.policy import ToolLoopPolicy, parse_policy
from loops.services import budgets
from loops.services.budget_rules import RunLimits, run_scope
from loops.services.harness_limits import HarnessLimits, harness_limits_of, tightened
from loops.services.runs import role_harness_snapshots, run_act
from tests.support.factories import make_pattern, make_run
from tests.support.limits import InlineEngine, snapshot
from tests.support.write_paths import both_write_paths

_tags = itertools.count(1)


def harness_run(
    settings: dict[str, Any],
    *,
    policy: dict[str, Any] | None = None,
    repository: dict[str, Any] | None = None,
) -> tuple[LoopRun, str]:
    """A queued run whose three roles compile a fresh profile with ``settings`` (the layer
    name, ``profile:<tag>@1``, comes back too)."""
    tag = f"hl-{next(_tags)}-{id(settings) % 10_000}"
    profile_create(tag=tag, settings=settings)
    pattern = make_pattern(
        policy=policy or {},
        leader_harness_tag=tag,
        maker_harness_tag=tag,
        verifier_harness_tag=tag,
    )
    snapshots = role_harness_snapshots(pattern, parse_policy(pattern.policy), None)
    run = make_run(
        pattern,
        policy_snapshot=snapshot(pattern.policy),
        harness_snapshots=snapshots,
        repository_snapshot=repository or {},
    )
    return run, f"profile:{tag}@1"


def ended(run: LoopRun) -> tuple[str, str, str]:
    run.refresh_from_db()
    return run.status, run.terminal_reason, run.failure_reason


def harness_event(run: LoopRun) -> LoopEvent:
    return LoopEvent.objects.get(run=run, type="harness.limit_reached")


def used(run: LoopRun, metric: str) -> Decimal:
    row = UsageBucket.objects.filter(scope=run_scope(run.id), metric=metric).first()
    return Decimal(row.value) if row else Decimal(0)


# --- per-run totals ------------------------------------------------------------------------


@both_write_paths
def test_max_invocations_ends_the_run_failed_before_the_third_invocation() -> None:
    engine = InlineEngine()
    engine.model.stop.set()  # the maker answers at once
    run, layer = harness_run({"limits": {"maxInvocations": 2}})
    assert engine.drive(run.id) == RunStatus.FAILED
    assert ended(run) == (
        "failed",
        "harness_limit:limits.maxInvocations",
        f"limits.maxInvocations = 2 (set by {layer}): 2 invocations ran",
    )
    event = harness_event(run)
    assert event.to_status == RunStatus.FAILED
    assert {k: event.data[k] for k in ("setting", "value", "layer", "used")} == {
        "setting": "limits.maxInvocations",
        "value": 2,
        "layer": layer,
        "used": 2,
    }
    assert engine.model.calls_by("verifier") == 0
    assert used(run, "invocations") == 2


@both_write_paths
def test_max_tool_calls_stops_the_run_at_the_limit_and_never_past_it() -> None:
    engine = InlineEngine()
    run, layer = harness_run({"limits": {"maxToolCalls": 5}})
    assert engine.drive(run.id) == RunStatus.FAILED
    assert ended(run) == (
        "failed",
        "harness_limit:limits.maxToolCalls",
        f"limits.maxToolCalls = 5 (set by {layer}): 5 tool calls were made",
    )
    assert engine.executed == 5
    assert LoopStep.objects.filter(run=run, kind="tool").count() == 5
    assert used(run, "toolCalls") == 5
    assert harness_event(run).data["setting"] == "limits.maxToolCalls"


@both_write_paths
@pytest.mark.parametrize(
    ("setting", "value", "figure"),
    [
        ("maxTokens", 10_000, "10000 tokens were used"),
        ("maxCost", 0.5, "0.5 was spent"),
    ],
)
def test_max_tokens_and_cost_stop_the_next_model_call(
    setting: str, value: float, figure: str
) -> None:
    """Each model call is charged 500 tokens and 0.025: both limits are used up exactly by
    the 20th call (the leader's and 19 of the maker's), so the 19th maker call's tool call is
    refused and no 21st call starts: the points and figures of the per-run budgets."""
    engine = InlineEngine()
    run, layer = harness_run({"limits": {setting: value}})
    assert engine.drive(run.id) == RunStatus.FAILED
    assert ended(run) == (
        "failed",
        f"harness_limit:limits.{setting}",
        f"limits.{setting} = {value:g} (set by {layer}): {figure}",
    )
    assert len(engine.model.requests) == 20 and engine.executed == 18
    assert used(run, "tokens") == 10_000


@both_write_paths
@pytest.mark.parametrize(
    ("budget", "harness", "expected"),
    [
        (
            3,
            5,
            ("blocked", "budget_exhausted:toolCalls", "per-run budget toolCalls exhausted (3/3)"),
        ),
        (5, 3, ("failed", "harness_limit:limits.maxToolCalls", "limits.maxToolCalls = 3 (set by")),
        (4, 4, ("failed", "harness_limit:limits.maxToolCalls", "limits.maxToolCalls = 4 (set by")),
    ],
    ids=["budget-stricter", "harness-stricter", "tie-goes-to-the-harness"],
)
def test_the_stricter_of_budget_and_harness_wins_and_the_reason_says_which(
    budget: int, harness: int, expected: tuple[str, str, str]
) -> None:
    engine = InlineEngine()
    run, _ = harness_run(
        {"limits": {"maxToolCalls": harness}},
        policy={"budgets": {"perRun": {"toolCalls": budget}}},
    )
    assert engine.drive(run.id) == expected[0]
    status, code, reason = ended(run)
    assert (status, code) == expected[:2] and reason.startswith(expected[2])
    assert engine.executed == min(budget, harness)


@pytest.mark.django_db
def test_a_raise_of_the_budget_cannot_lift_a_harness_limit() -> None:
    """The budget blocks first; raised past the harness's value, the harness ends the run."""
    engine = InlineEngine()
    run, layer = harness_run(
        {"limits": {"maxToolCalls": 6}}, policy={"budgets": {"perRun": {"toolCalls": 4}}}
    )
    assert engine.drive(run.id) == RunStatus.BLOCKED
    budgets.run_budget_raise(run_id=run.id, per_run={"toolCalls": 50}, actor="op")
    run_act(run_id=run.id, action="resume", actor="op")
    assert engine.drive(run.id) == RunStatus.FAILED
    assert ended(run)[1:] == (
        "harness_limit:limits.maxToolCalls",
        f"limits.maxToolCalls = 6 (set by {layer}): 6 tool calls were made",
    )
    assert engine.executed == 6


def test_tightened_limits_keep_the_stricter_and_name_the_harness_on_a_tie() -> None:
    snap = {
        "settings": {"limits": {"maxToolCalls": 4, "maxInvocations": 9, "maxCost": 1.5}},
        "provenance": {"limits.maxToolCalls": "pattern"},
    }
    harness = harness_limits_of(snap)
    limits = RunLimits(
        run_id=uuid.uuid4(),
        pattern_id=1,
        per_run={"toolCalls": Decimal(4), "invocations": Decimal(3)},
        daily={},
        tool_loop=ToolLoopPolicy(),
        day="d",
    )
    judged = tightened(limits, harness)
    assert judged.per_run == {
        "toolCalls": Decimal(4),
        "invocations": Decimal(3),
        "cost": Decimal("1.5"),
    }
    assert sorted(judged.harness) == ["cost", "toolCalls"]
    assert judged.harness["toolCalls"].label == "limits.maxToolCalls = 4 (set by pattern)"
    assert tightened(limits, HarnessLimits()) is limits
    assert harness.near({"toolCalls": Decimal(3)}, {"toolCalls": 1}) is False
    assert harness.near({"toolCalls": Decimal(4)}, {"toolCalls": 1}) is True
    assert harness.near({"cost": Decimal("1.4")}, {"cost": 0}) is False
    assert harness.near({"cost": Decimal("1.5")}, {"cost": 0}) is True

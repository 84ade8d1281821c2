"""Budgets: the arithmetic (pure), the buckets and the journal's checkpoints (fenced services),
the operator's raise, and the real engine stopping a run that loops forever (in process)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from loops.models import LoopEvent, LoopPattern, LoopRun, LoopStep, RunStatus, UsageBucket
from loops.services import budget_rules, budgets
from loops.services.budget_rules import (
    Exhausted,
    daily_scope,
    fits,
    has_room,
    parallel_admissible,
    run_scope,
)
from loops.services.budgets import budget_admit_model_call, budget_invocation_start
from loops.services.patterns import pattern_create
from loops.services.runs import run_act, run_trigger
from loops.services.steps import step_begin, step_complete, step_record, tool_step_begin
from loops.services.transitions import Lease, run_transition
from loops.triggers.guards import trigger_refusal
from orchestrator.errors import Conflict, InvalidInput
from runtime.invocation import BudgetExhausted
from tests.support.factories import make_pattern
from tests.support.limits import InlineEngine, queued_run, running_run, tool_request
from tests.support.write_paths import both_write_paths

D = Decimal


def used(scope: str, metric: str) -> Decimal:
    row = UsageBucket.objects.filter(scope=scope, metric=metric).first()
    return D(row.value) if row else D(0)


def today(pattern_id: int) -> str:
    return daily_scope(pattern_id, datetime.now(UTC))


def begin_call(lease: Lease, name: str = "read", arguments: object = None, n: int = 0) -> int:
    start = tool_step_begin(
        lease,
        role="maker",
        invocation="maker:0",
        name=name,
        request=tool_request(arguments if arguments is not None else {"n": n}),
    )
    assert not start.refused
    return start.seq


def model_step(lease: Lease, *, tokens: tuple[int, int] = (400, 100), cost: float = 0.0) -> int:
    return step_record(
        lease,
        role="maker",
        invocation="maker:0",
        kind="model",
        name="m",
        request={"step": 1},
        response={"message": {"role": "assistant", "content": "x"}},
        tokens_in=tokens[0],
        tokens_out=tokens[1],
        cost=cost,
    )


# --- pure arithmetic ---------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [0, 1, 3, 20])
def test_counted_units_are_taken_until_the_limit_and_never_past_it(limit: int) -> None:
    value, taken = D(0), 0
    for _ in range(limit + 5):
        if fits(value, D(1), D(limit)):
            value, taken = value + 1, taken + 1
    assert value == taken == limit


def test_a_metered_call_may_start_while_any_room_is_left() -> None:
    assert has_room(D("9999"), D("10000"))
    assert not has_room(D("10000"), D("10000"))
    assert not has_room(D("10450"), D("10000"))


@pytest.mark.parametrize(
    ("used_", "in_flight", "high", "expected"),
    [
        (0, 0, 0, True),  # alone: always, while there is room
        (9_999, 0, 500, True),
        (0, 1, 0, False),  # beside another, with no idea of a call's size: never
        (0, 1, 500, True),  # 0 + 2 calls x 2 x 500 <= 10k
        (8_000, 1, 500, True),  # 8000 + 2000 = 10k
        (8_001, 1, 500, False),
        (10_000, 0, 500, False),  # used up
    ],
)
def test_parallel_admission_needs_headroom_for_every_call_in_flight(
    used_: int, in_flight: int, high: int, expected: bool
) -> None:
    assert parallel_admissible(D(used_), D(10_000), in_flight, D(high)) is expected


def test_parallel_calls_admitted_by_the_rule_cannot_cross_the_limit_together() -> None:
    """Calls no larger than the high water mark, admitted beside each other, stay within the
    limit together: only a call admitted alone can cross it (by itself)."""
    limit, high = D(10_000), D(500)
    for start, flight in itertools.product(range(0, 10_001, 250), range(1, 6)):
        if parallel_admissible(D(start), limit, flight, high):
            assert D(start) + (flight + 1) * high <= limit


def test_the_daily_scope_is_the_pattern_and_the_utc_day() -> None:
    late = datetime(2026, 3, 1, 23, 30, tzinfo=UTC)
    assert daily_scope(7, late) == "pattern:7:2026-03-01"
    tokyo = late.astimezone(UTC).astimezone(tz=__import__("zoneinfo").ZoneInfo("Asia/Tokyo"))
    assert daily_scope(7, tokyo) == "pattern:7:2026-03-01"  # 08:30 on the 2nd in Tokyo
    assert budget_rules.next_reset(late) == datetime(2026, 3, 2, tzinfo=UTC)


def test_an_exhausted_budget_is_named_with_its_figures() -> None:
    spent = Exhausted("perRun", "run:x", "toolCalls", D(20), D(20))
    assert spent.reason == "per-run budget toolCalls exhausted (20/20)"
    assert spent.code == "budget_exhausted:toolCalls"
    assert spent.data() == {
        "scope": "run:x",
        "kind": "perRun",
        "metric": "toolCalls",
        "used": 20,
        "limit": 20,
    }
    cost = Exhausted("daily", "pattern:1:2026-03-01", "cost", D("0.525"), D("0.5"))
    assert cost.reason == "daily budget cost exhausted (0.525/0.5)"
    assert cost.data()["used"] == 0.525


# --- buckets and the journal's checkpoints -------------------------------------------------


@both_write_paths
def test_tool_calls_are_counted_as_they_begin_and_refused_past_the_per_run_limit() -> None:
    run, lease = running_run(policy={"budgets": {"perRun": {"toolCalls": 3}}})
    for n in range(3):
        begin_call(lease, n=n)
    with pytest.raises(BudgetExhausted) as refused:
        begin_call(lease, n=3)
    assert str(refused.value) == "per-run budget toolCalls exhausted (3/3)"
    assert refused.value.code == "budget_exhausted:toolCalls"
    assert refused.value.data == {
        "scope": run_scope(run.id),
        "kind": "perRun",
        "metric": "toolCalls",
        "used": 3,
        "limit": 3,
    }
    assert LoopStep.objects.filter(run=run).count() == 3  # the refused call left no step
    assert used(run_scope(run.id), "toolCalls") == 3
    assert used(today(run.pattern_id), "toolCalls") == 3  # the day counts without a limit


@both_write_paths
def test_a_refusal_of_the_daily_budget_takes_back_the_runs_own_unit() -> None:
    pattern = make_pattern(policy={"budgets": {"daily": {"toolCalls": 1}}})
    _, first = running_run(pattern)
    second_run, second = running_run(pattern)
    begin_call(first)
    with pytest.raises(BudgetExhausted, match=r"daily budget toolCalls exhausted \(1/1\)"):
        begin_call(second)
    assert used(run_scope(second_run.id), "toolCalls") == 0
    assert used(today(pattern.pk), "toolCalls") == 1


@pytest.mark.django_db
def test_a_delegations_budget_is_refused_because_nothing_would_count_it() -> None:
    with pytest.raises(InvalidInput) as caught:
        pattern_create(
            key="delegating",
            actor="op",
            goal_template="Go",
            leader_username="leader",
            maker_usernames=["maker"],
            verifier_username="verifier",
            policy={"budgets": {"perRun": {"delegations": 1}}},
        )
    [error] = caught.value.extra["errors"]
    assert error["pointer"] == "/policy/budgets/perRun/delegations"
    assert "nothing counts delegations" in error["detail"]
    assert not LoopPattern.objects.filter(key="delegating").exists()


@both_write_paths
def test_a_gated_call_is_counted_when_it_is_gated() -> None:
    run, lease = running_run(policy={"budgets": {"perRun": {"toolCalls": 1}}})
    tool_step_begin(
        lease,
        role="maker",
        invocation="maker:0",
        name="write",
        request=tool_request({"path": "a"}),
        status="gated",
    )
    assert used(run_scope(run.id), "toolCalls") == 1
    with pytest.raises(BudgetExhausted):
        begin_call(lease, arguments={"path": "b"})


@both_write_paths
def test_model_steps_charge_tokens_and_cost_to_the_run_and_its_day() -> None:
    run, lease = running_run()
    model_step(lease, tokens=(400, 100), cost=0.025)
    model_step(lease, tokens=(300, 50), cost=0.0125)
    for scope in (run_scope(run.id), today(run.pattern_id)):
        assert used(scope, "tokens") == 850
        assert used(scope, "cost") == D("0.0375")


@both_write_paths
def test_a_step_that_reports_usage_on_completion_is_charged_once() -> None:
    run, lease = running_run()
    seq = step_begin(lease, role="maker", invocation="m", kind="tool", name="skill", request={})
    step_complete(lease, seq, response={"ok": 1}, tokens_in=10, tokens_out=5, cost=0.5)
    step_complete(lease, seq, response={"ok": 1}, tokens_in=10, tokens_out=5, cost=0.5)
    assert used(run_scope(run.id), "tokens") == 15 and used(run_scope(run.id), "cost") == D("0.5")


@both_write_paths
def test_a_model_call_may_not_start_once_tokens_are_used_up() -> None:
    _, lease = running_run(policy={"budgets": {"perRun": {"tokens": 1000}}})
    for _ in range(2):
        assert budget_admit_model_call(lease) is None
        model_step(lease)  # 500 tokens each: 1000 of 1000
    with pytest.raises(BudgetExhausted, match=r"per-run budget tokens exhausted \(1000/1000\)"):
        budget_admit_model_call(lease)
    with pytest.raises(BudgetExhausted, match="tokens exhausted"):
        begin_call(lease)  # nothing else starts either


@both_write_paths
def test_a_run_overshoots_a_cost_budget_by_at_most_the_call_that_crossed_it() -> None:
    run, lease = running_run(policy={"budgets": {"perRun": {"cost": 0.05}}})
    calls = 0
    with pytest.raises(BudgetExhausted):
        while True:
            budget_admit_model_call(lease)
            model_step(lease, cost=0.03)
            calls += 1
    assert calls == 2 and used(run_scope(run.id), "cost") == D("0.06")  # 0.06 < 0.05 + 0.03


@both_write_paths
def test_an_invocation_is_counted_once_however_often_it_resumes() -> None:
    run, lease = running_run(policy={"budgets": {"perRun": {"invocations": 2}}})
    assert budget_invocation_start(lease, role="leader", invocation="leader") is True
    assert budget_invocation_start(lease, role="leader", invocation="leader") is False
    assert budget_invocation_start(lease, role="verifier", invocation="verifier") is True
    assert used(run_scope(run.id), "invocations") == 2
    assert used(run_scope(run.id), "verifications") == 1
    with pytest.raises(BudgetExhausted, match=r"invocations exhausted \(2/2\)"):
        budget_invocation_start(lease, role="maker", invocation="maker:0")
    started = LoopEvent.objects.filter(run=run, type="invocation.started")
    assert [e.data["invocation"] for e in started.order_by("seq")] == ["leader", "verifier"]


@both_write_paths
def test_the_verifications_budget_refuses_the_verifier() -> None:
    _, lease = running_run(policy={"budgets": {"perRun": {"verifications": 0}}})
    budget_invocation_start(lease, role="maker", invocation="maker:0")
    with pytest.raises(BudgetExhausted, match="verifications exhausted"):
        budget_invocation_start(lease, role="verifier", invocation="verifier")


# --- the shared daily tokens budget: admission of parallel calls ---------------------------


@both_write_paths
def test_a_call_waits_while_another_runs_call_is_in_flight_with_no_size_known() -> None:
    pattern = make_pattern(policy={"budgets": {"daily": {"tokens": 10_000}}})
    _, first = running_run(pattern)
    _, second = running_run(pattern)
    assert budget_admit_model_call(first) is None
    assert budget_admit_model_call(second) == budget_rules.ADMISSION_RETRY_SECONDS
    model_step(first)  # charged: the first call is no longer in flight
    assert budget_admit_model_call(second) is None


@both_write_paths
def test_calls_run_in_parallel_while_the_headroom_is_large() -> None:
    pattern = make_pattern(policy={"budgets": {"daily": {"tokens": 10_000}}})
    _, first = running_run(pattern)
    _, second = running_run(pattern)
    budget_admit_model_call(first)
    model_step(first)  # 500 charged: the high water mark is known now
    assert budget_admit_model_call(first) is None
    assert budget_admit_model_call(second) is None  # 500 + 2 x 2 x 500 <= 10k


@both_write_paths
def test_near_the_limit_calls_go_one_at_a_time() -> None:
    pattern = make_pattern(policy={"budgets": {"daily": {"tokens": 2_000}}})
    _, first = running_run(pattern)
    _, second = running_run(pattern)
    budget_admit_model_call(first)
    model_step(first)
    assert budget_admit_model_call(first) is None
    assert (
        budget_admit_model_call(second) == budget_rules.ADMISSION_RETRY_SECONDS
    )  # 500+2000 > 2000


@both_write_paths
def test_the_admission_of_a_run_whose_lease_is_gone_holds_nothing() -> None:
    pattern = make_pattern(policy={"budgets": {"daily": {"tokens": 10_000}}})
    first_run, first = running_run(pattern)
    _, second = running_run(pattern)
    budget_admit_model_call(first)
    run_transition(run_id=first_run.id, to=RunStatus.QUEUED, actor="reaper")  # lease lost
    assert budget_admit_model_call(second) is None


# --- trigger refusals and the operator's raise ---------------------------------------------


@pytest.mark.django_db
def test_a_pattern_whose_daily_budget_is_used_up_refuses_triggers() -> None:
    pattern = make_pattern(policy={"budgets": {"daily": {"invocations": 1}}})
    assert trigger_refusal(pattern) is None
    _, lease = running_run(pattern)
    budget_invocation_start(lease, role="leader", invocation="leader")
    reason = trigger_refusal(pattern)
    assert reason is not None and reason.startswith("daily budget invocations exhausted (1/1)")
    assert "resets at" in reason and reason.endswith("T00:00:00Z")
    with pytest.raises(Conflict) as refused:
        run_trigger(pattern=pattern, actor="op")
    assert "daily budget invocations exhausted (1/1)" in refused.value.detail
    assert refused.value.extra["budget"]["metric"] == "invocations"


@pytest.mark.django_db
def test_an_operator_raises_a_runs_budget() -> None:
    run, _ = running_run(policy={"budgets": {"perRun": {"toolCalls": 20, "cost": 0.5}}})
    raised = budgets.run_budget_raise(
        run_id=run.id, per_run={"toolCalls": 40, "cost": None}, actor="op"
    )
    assert raised.policy_snapshot["budgets"]["perRun"]["toolCalls"] == 40
    assert raised.policy_snapshot["budgets"]["perRun"]["cost"] is None
    event = LoopEvent.objects.get(run=run, type="budget.raised")
    assert event.actor == "op"
    assert event.data == {
        "perRun": {"cost": {"from": 0.5, "to": None}, "toolCalls": {"from": 20, "to": 40}}
    }
    assert budgets.run_limits(run.id).per_run == {"toolCalls": D(40)}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("pinned", "asked", "detail"),
    [
        ({"toolCalls": 20}, {"toolCalls": 10}, "toolCalls is limited to 20 on this run"),
        ({}, {"tokens": 5000}, "tokens has no per-run limit on this run"),
        ({}, {}, "Name at least one perRun limit"),
        ({}, {"tokenz": 1}, "The budget is invalid"),
        ({}, {"toolCalls": -1}, "The budget is invalid"),
    ],
)
def test_only_raises_of_a_runs_budget_are_accepted(
    pinned: dict[str, int], asked: dict[str, int], detail: str
) -> None:
    run, _ = running_run(policy={"budgets": {"perRun": pinned}})
    with pytest.raises(InvalidInput, match=detail):
        budgets.run_budget_raise(run_id=run.id, per_run=asked, actor="op")
    assert not LoopEvent.objects.filter(run=run, type="budget.raised").exists()


@pytest.mark.django_db
def test_a_finished_runs_budget_cannot_change() -> None:
    run, _ = running_run(policy={"budgets": {"perRun": {"toolCalls": 1}}})
    run_act(run_id=run.id, action="cancel", actor="op")
    with pytest.raises(Conflict, match="canceled"):
        budgets.run_budget_raise(run_id=run.id, per_run={"toolCalls": 5}, actor="op")


@pytest.mark.django_db
def test_the_budget_endpoint_raises_for_operators_only_and_shows_usage(
    api_client_for: Callable[[str], APIClient],
) -> None:
    run, lease = running_run(policy={"budgets": {"perRun": {"toolCalls": 1}}})
    begin_call(lease)
    url = f"/api/v1/runs/{run.id}/budget"
    body = {"perRun": {"toolCalls": 5}}
    assert api_client_for("viewer").post(url, body, format="json").status_code == 403
    response = api_client_for("operator").post(url, body, format="json")
    assert response.status_code == 200, response.content
    usage = response.json()["budget_usage"]
    assert usage["perRun"]["toolCalls"] == {"used": 1, "limit": 5}
    assert usage["daily"]["scope"] == today(run.pattern_id)
    assert usage["daily"]["toolCalls"] == {"used": 1, "limit": None}
    lower = api_client_for("operator").post(url, {"perRun": {"toolCalls": 2}}, format="json")
    assert lower.status_code == 400
    assert lower.json()["errors"][0]["pointer"] == "/perRun/toolCalls"
    assert api_client_for("operator").post(url, {}, format="json").status_code == 400


# --- the real engine, in process ------------------------------------------------------------


def blocked_event(run: LoopRun) -> LoopEvent:
    return LoopEvent.objects.get(run=run, type="budget.exhausted")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("budget", "metric", "figures"),
    [
        ({"toolCalls": 20}, "toolCalls", "(20/20)"),
        ({"tokens": 10_000}, "tokens", "(10000/10000)"),
        ({"cost": 0.5}, "cost", "(0.5/0.5)"),
    ],
)
def test_a_run_that_loops_forever_stops_blocked_with_the_budget_named(
    budget: dict[str, float], metric: str, figures: str
) -> None:
    """P4: each model call costs 500 tokens and $0.025 and makes one tool call, so each of
    these budgets is used up exactly at its limit; the run stops there, overshoot 0."""
    engine = InlineEngine()
    run = queued_run(make_pattern(policy={"budgets": {"perRun": budget}}))
    assert engine.drive(run.id) == RunStatus.BLOCKED
    run.refresh_from_db()
    assert run.terminal_reason == f"budget_exhausted:{metric}"
    assert run.failure_reason == f"per-run budget {metric} exhausted {figures}"
    event = blocked_event(run)
    assert event.to_status == RunStatus.BLOCKED
    assert {k: event.data[k] for k in ("scope", "metric", "limit")} == {
        "scope": run_scope(run.id),
        "metric": metric,
        "limit": budget[metric],
    }
    executed = engine.executed
    model_calls = len(engine.model.requests)
    if metric == "toolCalls":  # the 21st call is refused
        assert executed == 20 and model_calls == 22
    else:  # the leader's call and 19 of the maker's use it up; the 19th's tool call is refused
        assert model_calls == 20 and executed == 18
    assert used(run_scope(run.id), "tokens") == 500 * model_calls


@pytest.mark.django_db
def test_a_blocked_run_continues_after_its_budget_is_raised_and_it_is_resumed() -> None:
    engine = InlineEngine()
    run = queued_run(make_pattern(policy={"budgets": {"perRun": {"toolCalls": 5}}}))
    assert engine.drive(run.id) == RunStatus.BLOCKED
    assert engine.executed == 5
    budgets.run_budget_raise(run_id=run.id, per_run={"toolCalls": 8}, actor="op")
    run_act(run_id=run.id, action="resume", actor="op")
    run.refresh_from_db()
    assert (run.status, run.terminal_reason, run.failure_reason) == ("queued", "", "")
    assert engine.drive(run.id) == RunStatus.BLOCKED
    assert engine.executed == 8  # three more, nothing re-run
    budgets.run_budget_raise(run_id=run.id, per_run={"toolCalls": 100}, actor="op")
    engine.model.stop.set()  # the maker finishes at its next step
    run_act(run_id=run.id, action="resume", actor="op")
    assert engine.drive(run.id) == RunStatus.SUCCEEDED
    run.refresh_from_db()
    assert run.terminal_reason == "verified" and run.failure_reason == ""
    assert engine.executed == 9  # the call that was refused runs now, then the maker stops
    assert used(run_scope(run.id), "invocations") == 3  # leader, maker, verifier: once each
    assert used(run_scope(run.id), "toolCalls") == 9
    keys = [c.idempotency_key for _, c in engine.peek.calls + engine.probe.calls]
    assert len(keys) == len(set(keys)) == 9


@pytest.mark.django_db
def test_runs_are_blocked_before_an_invocation_when_invocations_are_used_up() -> None:
    engine = InlineEngine()
    engine.model.stop.set()
    run = queued_run(make_pattern(policy={"budgets": {"perRun": {"invocations": 2}}}))
    assert engine.drive(run.id) == RunStatus.BLOCKED
    run.refresh_from_db()
    assert run.terminal_reason == "budget_exhausted:invocations"
    assert run.status == "blocked" and engine.model.calls_by("verifier") == 0
    assert run.cursor["phase"] == "verifier"  # leader and maker done; resume goes on from here
    assert LoopRun.objects.get(pk=run.id).events.filter(type="verification.started").exists()

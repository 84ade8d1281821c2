"""Runs of one pattern racing on its shared daily budget, one connection per thread.

On PostgreSQL the conditional ``UPDATE`` re-checks its condition on the row it waited for and
the admission of a model call locks the day's buckets; on SQLite the IMMEDIATE transactions
serialise writers. Either way: a counted budget ends exactly at its limit, and a metered one
overshoots by at most one call in total (docs/reliability.md P4).
"""

from __future__ import annotations

import random
import threading
import time
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from loops.models import LoopStep, UsageBucket
from loops.services.budget_rules import daily_scope
from loops.services.budgets import budget_admit_model_call
from loops.services.steps import step_record, tool_step_begin
from loops.services.transitions import Lease
from runtime.invocation import BudgetExhausted
from tests.support.factories import make_pattern
from tests.support.limits import running_run, tool_request
from tests.support.threads import in_threads

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

RUNS = 6


def day_usage(pattern_id: int, metric: str) -> Decimal:
    scope = daily_scope(pattern_id, datetime.now(UTC))
    return Decimal(UsageBucket.objects.get(scope=scope, metric=metric).value)


def test_parallel_runs_take_a_shared_daily_tool_call_budget_exactly_to_its_limit() -> None:
    pattern = make_pattern(policy={"budgets": {"daily": {"toolCalls": 25}}})
    leases = [running_run(pattern, owner=f"w{i}")[1] for i in range(RUNS)]

    def call_until_refused(index: int) -> tuple[int, BudgetExhausted]:
        lease, made = leases[index], 0
        while True:
            try:
                tool_step_begin(
                    lease,
                    role="maker",
                    invocation="maker:0",
                    name="read",
                    request=tool_request({"n": made}),
                )
            except BudgetExhausted as refused:
                return made, refused
            made += 1

    results = in_threads(RUNS, call_until_refused)
    assert all(isinstance(r, tuple) for r in results), results
    assert sum(made for made, _ in results) == 25
    assert all(refused.data["metric"] == "toolCalls" for _, refused in results)
    assert all(refused.data["kind"] == "daily" for _, refused in results)
    assert day_usage(pattern.pk, "toolCalls") == 25
    assert LoopStep.objects.filter(run__pattern=pattern).count() == 25


def test_parallel_runs_overshoot_a_shared_daily_token_budget_by_one_call_at_most() -> None:
    limit, size = 10_000, 500
    pattern = make_pattern(policy={"budgets": {"daily": {"tokens": limit}}})
    leases = [running_run(pattern, owner=f"w{i}")[1] for i in range(RUNS)]
    in_flight, peak, guard = [0], [0], threading.Lock()

    def admit(lease: Lease) -> None:
        while (wait := budget_admit_model_call(lease)) is not None:
            time.sleep(wait / 10)

    def model_call(lease: Lease) -> None:
        with guard:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        time.sleep(random.uniform(0.03, 0.08))  # the provider answering
        with guard:
            in_flight[0] -= 1
        step_record(
            lease,
            role="maker",
            invocation="maker:0",
            kind="model",
            name="m",
            request={},
            response={"message": {"role": "assistant", "content": "x"}},
            tokens_in=size - 100,
            tokens_out=100,
        )

    def call_until_refused(index: int) -> int:
        calls = 0
        while True:
            try:
                admit(leases[index])
            except BudgetExhausted:
                return calls
            model_call(leases[index])
            calls += 1

    results = in_threads(RUNS, call_until_refused)
    assert all(isinstance(r, int) for r in results), results
    total = day_usage(pattern.pk, "tokens")
    assert total == size * sum(results)
    assert limit <= total <= limit + size, f"{sum(results)} calls charged {total}"
    assert peak[0] >= 2, "far from the limit, calls should have run in parallel"

"""The Metrics page's usage per day, read from the budgets' day buckets: runs driven through the
real engine (scripted model, recording tools) show on the page exactly what their steps spent,
over every pattern, disabled ones too; a past day's usage shows on that UTC day."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db.models import Sum
from django.test import Client
from django.utils import timezone

from frontend.selectors.metrics import metrics_summary
from frontend.selectors.metrics_usage import day_buckets_sql, usage_days
from loops.models import LoopEvent, LoopPattern, LoopRun, LoopStep, RunStatus, UsageBucket
from loops.services.budget_rules import INVOCATION_STARTED
from tests.support.factories import make_pattern
from tests.support.limits import InlineEngine, LoopingModel, queued_run
from tests.support.usage import charge

pytestmark = pytest.mark.django_db
ClientAs = Callable[[str], Client]


def calls_then_answer(calls: int) -> Callable[[Sequence[dict[str, Any]]], Any]:
    """A maker that makes ``calls`` tool calls, one a step, alternating tools, then answers."""

    def turn(messages: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]] | None:
        made = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
        return [("probe" if made % 2 else "peek", {"n": made})] if made < calls else None

    return turn


def drive(pattern: LoopPattern, *, calls: int, usage: tuple[int, int], cost: float) -> LoopRun:
    model = LoopingModel(maker_turn=calls_then_answer(calls), usage=usage, cost=cost)
    run = queued_run(pattern)
    assert InlineEngine(model=model).drive(run.id) == RunStatus.SUCCEEDED
    return run


def spent(runs: list[LoopRun]) -> dict[str, Any]:
    """What the runs' own journals say they spent."""
    steps = LoopStep.objects.filter(run__in=runs)
    sums = steps.aggregate(tin=Sum("tokens_in"), tout=Sum("tokens_out"), cost=Sum("cost"))
    return {
        "invocations": LoopEvent.objects.filter(run__in=runs, type=INVOCATION_STARTED).count(),
        "tool_calls": steps.filter(kind="tool").count(),
        "tokens": int(sums["tin"]) + int(sums["tout"]),
        "cost": Decimal(sums["cost"]).quantize(Decimal("0.000001")),
    }


def test_the_days_figures_are_what_the_engines_runs_spent(client_as: ClientAs) -> None:
    cheap, dear = make_pattern(key="cheap"), make_pattern(key="dear")
    runs = [
        drive(cheap, calls=2, usage=(300, 40), cost=0.0125),
        drive(cheap, calls=3, usage=(310, 45), cost=0.0125),
        drive(dear, calls=1, usage=(1200, 800), cost=0.5),
    ]
    LoopPattern.objects.filter(pk=dear.pk).update(enabled=False)  # still counted
    expected = spent(runs)
    assert expected["tool_calls"] == 6 and expected["invocations"] == 9

    [today] = metrics_summary(days=1).usage
    assert today.day == datetime.now(UTC).date()
    figures = {
        "invocations": today.invocations,
        "tool_calls": today.tool_calls,
        "tokens": today.tokens,
        "cost": today.cost,
    }
    assert figures == expected
    # The day's largest-call rows sit beside the sums and are left out of them.
    assert UsageBucket.objects.filter(metric="tokens:max_call", value=2000).exists()

    page = client_as("viewer").get("/ui/metrics?days=1").content.decode()
    row = page.split('id="usage-per-day"')[1].split("</tr>")[1]
    assert f"<td>{today.day.isoformat()}</td>" in row
    assert f'<td class="num">{expected["tokens"]:,}</td>' in row
    assert f'<td class="num">{expected["tool_calls"]}</td>' in row
    assert f"{expected['cost']:.4f}" in row


def test_a_past_days_usage_shows_on_its_utc_day_and_the_window_counts_whole_days() -> None:
    run = LoopRun.objects.get(pk=queued_run().pk)
    now = timezone.now()
    charge(run, tokens=500, cost=0.25, tool_calls=2, at=now - timedelta(days=3))
    charge(run, tokens=70, at=now - timedelta(days=40))  # outside a 7-day window
    charge(run, tokens=30, invocations=1, at=now)

    usage = metrics_summary(days=7, now=now).usage
    by_day = {day.day: (day.invocations, day.tool_calls, day.tokens, day.cost) for day in usage}
    three_days_ago = (now - timedelta(days=3)).astimezone(UTC).date()
    assert by_day == {
        now.astimezone(UTC).date(): (1, 0, 30, Decimal(0)),
        three_days_ago: (0, 2, 500, Decimal("0.25")),
    }
    assert [day.day for day in usage] == sorted(by_day, reverse=True)  # newest first
    days = usage_days(now - timedelta(days=7), now)
    assert len(days) == 8 and days[0] == (now - timedelta(days=7)).astimezone(UTC).date()
    _, params = day_buckets_sql(days)
    assert params[-len(days) :] == [day.isoformat() for day in days]

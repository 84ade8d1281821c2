"""The monitor answers "what is each run doing": its goal, the role and step it is at, what it
waits on, its cost (``unpriced`` when tokens were used at no price), counts where a parked run
is not "in flight", and search, a time range, four sort orders and cursor pages."""

from __future__ import annotations

import html as html_module
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from loops.models import LoopRun, LoopStep, RunStatus
from tests.support.factories import make_pattern, make_run

pytestmark = pytest.mark.django_db
ClientAs = Callable[[str], Client]


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.status_code
    return html_module.unescape(response.content.decode())


def row(text: str, run: LoopRun) -> str:
    return text.split(f'id="run-{run.id}"')[1].split("</tr>")[0]


def link(text: str, rel: str) -> str:
    return text.split(f'rel="{rel}"')[0].rsplit('href="', 1)[1].split('"')[0]


def step(run: LoopRun, seq: int, **fields: Any) -> None:
    defaults: dict[str, Any] = {
        "role": "maker", "invocation": "maker:0", "kind": "model", "status": "completed",
    }  # fmt: skip
    LoopStep.objects.create(run=run, seq=seq, **{**defaults, **fields})


def test_a_row_says_the_goal_the_role_and_step_the_cost_and_the_attempt(
    client_as: ClientAs,
) -> None:
    pattern = make_pattern()
    bindings = {"leader": "lea", "makers": ["max"], "verifier": "vera"}
    busy = make_run(
        pattern, status=RunStatus.RUNNING, goal="Fix the flaky login test", attempts=1,
        role_bindings=bindings,
    )  # fmt: skip
    step(busy, 1, tokens_in=100, tokens_out=20, cost=Decimal(0))
    step(busy, 2, kind="tool", name="write")
    parked = make_run(pattern, status=RunStatus.WAITING_HUMAN, goal="Ask first")
    text = page(client_as("viewer"), "/")
    busy_row = row(text, busy)
    assert "Fix the flaky login test" in busy_row
    assert "Maker 1 (max) · tool write" in busy_row
    assert "unpriced" in busy_row and "1 of 5" in busy_row
    assert "waiting for a human" in row(text, parked)
    counts = text.split('id="run-counts"')[1].split("</section>")[0]
    assert 'data-count="in_flight">1<' in counts and 'data-count="waiting_human">1<' in counts


def test_search_time_range_and_sort_narrow_and_order_the_runs(client_as: ClientAs) -> None:
    pattern = make_pattern(key="nightly-report")
    cheap = make_run(pattern, goal="Summarise the sales numbers")
    dear = make_run(make_pattern(), goal="Rewrite the billing module")
    old = make_run(make_pattern(), goal="Old work")
    LoopRun.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=3))
    step(cheap, 1, tokens_in=10, tokens_out=5, cost=Decimal("0.0010"))
    step(dear, 1, tokens_in=900, tokens_out=100, cost=Decimal("0.5000"))
    client = client_as("viewer")

    found = page(client, "/?q=billing")
    assert f"run-{dear.id}" in found and f"run-{cheap.id}" not in found
    assert f"run-{cheap.id}" in page(client, "/?q=nightly")  # the pattern key
    by_id = page(client, f"/?q={str(old.id)[-8:]}")  # the short id the table shows
    assert f"run-{old.id}" in by_id and f"run-{dear.id}" not in by_id
    recent = page(client, "/?period=24h")
    assert f"run-{old.id}" not in recent and f"run-{dear.id}" in recent

    by_cost = page(client, "/?sort=cost")
    assert by_cost.index(f"run-{dear.id}") < by_cost.index(f"run-{cheap.id}")
    assert by_cost.index(f"run-{cheap.id}") < by_cost.index(f"run-{old.id}")
    oldest = page(client, "/?sort=oldest")
    assert oldest.index(f"run-{old.id}") < oldest.index(f"run-{cheap.id}")
    assert 'data-live-insert="false"' in oldest  # new runs do not belong at its top


@pytest.mark.parametrize("sort", ["newest", "cost"])
def test_cursor_pages_cover_every_run_once_and_lead_back(client_as: ClientAs, sort: str) -> None:
    pattern = make_pattern()
    made = [make_run(pattern) for _ in range(53)]
    for n, run in enumerate(made):
        step(run, 1, tokens_in=n % 7, cost=Decimal(n % 3))  # ties on the sort value
    client = client_as("viewer")
    seen: list[str] = []
    text = page(client, f"/?sort={sort}")
    pages = [text]
    while 'rel="next"' in text:
        text = page(client, "/" + link(text, "next"))
        pages.append(text)
    for text in pages:
        seen += [part.split('"')[0] for part in text.split('data-run-id="')[1:]]
    assert sorted(seen) == sorted(str(r.id) for r in made) and len(pages) == 2
    back = page(client, "/" + link(pages[-1], "prev"))
    assert back.split('data-run-id="')[1:3] == pages[0].split('data-run-id="')[1:3]
    assert "Next →" in back and "First page" not in back
    assert page(client, "/?after=garbage").count('data-run-id="') == 50  # the first page

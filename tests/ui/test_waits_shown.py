"""A wait shown once: the run page's events and ``loopwright watch`` show one line when a lock
wait starts ("waiting for path lock on X held by run Y") and one when it ends ("waited 4m 02s,
120 polls, longest gap 2.1 s"); the run page and the monitor say what a waiting run waits on."""

from __future__ import annotations

import html as html_module
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from frontend.templatetags.waits import wait_line
from loops.models import LoopEvent, LoopRun, RunStatus
from loops.services.endings import run_transition
from orchestrator import cli
from tests.support.lock_waits import held_and_waiting, poll

pytestmark = pytest.mark.django_db
ClientAs = Callable[[str], Client]


@pytest.fixture(autouse=True)
def _lock_retry_at_once(settings: Any) -> None:
    settings.LOOPWRIGHT = {**settings.LOOPWRIGHT, "LOCK_RETRY_SECONDS": 0.0}


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.status_code
    return html_module.unescape(response.content.decode())


def test_a_waiting_run_shows_what_it_waits_on_and_its_wait_in_two_lines(
    client_as: ClientAs,
) -> None:
    holder, waiter = held_and_waiting()
    start = timezone.now().replace(microsecond=0)
    for i in range(3):
        poll(waiter, start + timedelta(seconds=2 * i))
    client = client_as("viewer")
    holder_id = str(holder.id)[:8]
    waiting_line = f"waiting for path lock on src/app.py held by run {holder_id}"
    run_page = page(client, f"/runs/{waiter.id}")
    assert "Waiting for" in run_page and f"path lock on src/app.py held by run {holder_id}" in (
        run_page
    )
    assert "3 polls" in run_page
    assert run_page.count(waiting_line) == 1  # the one lock.waiting event
    monitor = page(client, "/")
    assert waiting_line in monitor

    run_transition(run_id=holder.id, to=RunStatus.CANCELED, actor="op")
    assert poll(waiter, start + timedelta(seconds=242)) == RunStatus.SUCCEEDED
    run_page = page(client, f"/runs/{waiter.id}")
    assert "waited 4m 02s, 3 polls, longest gap 238.0 s (locks taken)" in run_page
    assert "Waiting for" not in run_page
    assert waiting_line in run_page


def test_watch_prints_a_wait_as_one_line_when_it_starts_and_one_when_it_ends() -> None:
    holder, waiter = held_and_waiting()
    start = timezone.now().replace(microsecond=0)
    for i in range(120):
        poll(waiter, start + timedelta(seconds=2 * i + (0.1 if i == 60 else 0)))
    run_transition(run_id=holder.id, to=RunStatus.CANCELED, actor="op")
    poll(waiter, start + timedelta(seconds=240))
    events = LoopEvent.objects.filter(run=waiter).order_by("seq")
    lines = [
        cli.format_event(
            {
                "seq": e.seq,
                "type": e.type,
                "from_status": e.from_status,
                "to_status": e.to_status,
                "actor": e.actor,
                "data": e.data,
                "created_at": e.created_at.isoformat(),
            }
        )
        for e in events
        if e.type in ("lock.waiting", "wait.ended")
    ]
    holder_id = str(holder.id)[:8]
    assert len(lines) == 2
    assert lines[0].endswith(f"waiting for path lock on src/app.py held by run {holder_id}")
    assert "preparing→waiting_lock" in lines[0]
    assert lines[1].endswith("waited 4m 00s, 120 polls, longest gap 2.1 s (locks taken)")
    assert "→" not in lines[1]  # a wait's end is no status change of its own
    assert LoopRun.objects.get(pk=waiter.pk).wait == {}


@pytest.mark.parametrize(
    ("event_type", "data"),
    [
        ("lock.waiting", {"paths": ["a.py", "b.py"], "held_by": ["01a23c5c-0000", "01b0"]}),
        ("lock.waiting", {"paths": ["a.py"]}),
        ("run.retry_later", {"kind": "model", "endpoint": "e1"}),
        ("wait.ended", {"waited_seconds": 3725, "polls": 1, "longest_gap_seconds": 9}),
        *[
            ("wait.ended", {"waited_seconds": 42.5, "polls": 7, "ended_by": by})
            for by in ("run.started", "lock.timeout", "run.canceled", "model.answered", "x.y")
        ],
    ],
)
def test_watch_and_the_run_page_say_a_wait_in_the_same_words(
    event_type: str, data: dict[str, object]
) -> None:
    """The CLI runs as a bare file and keeps its own copy of the words (orchestrator/cli_output.py)."""
    assert cli._wait_line(event_type, data) == wait_line(event_type, data)

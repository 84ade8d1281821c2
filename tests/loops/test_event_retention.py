"""Event retention (``loops.services.retention``): the events of runs ended past
``LOOPWRIGHT_EVENT_RETENTION_DAYS`` go, all but ``run.created``; nothing else does; the API and
the run page say so. On PostgreSQL a prune holding a batch never holds a claim up."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

from loops.models import LoopEvent, LoopRun, LoopStep, RunStatus
from loops.services.retention import BATCH_RUNS, events_prune, events_prune_batch
from loops.span_models import LoopSpanRecord
from loops.tasks import events_prune_task
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import api_token_create, user_ensure
from tests.support.factories import make_pattern, make_run

pytestmark = pytest.mark.django_db(transaction=True)


def _ended(pattern: Any, *, days_ago: float, status: str = RunStatus.SUCCEEDED, events: int = 5,
           spans_stored: bool = True) -> LoopRun:  # fmt: skip
    finished = timezone.now() - timedelta(days=days_ago)
    run = make_run(pattern, status=status, finished_at=finished, event_seq=events)
    LoopEvent.objects.bulk_create(
        LoopEvent(run=run, seq=seq, type="step.completed", data={"n": seq})
        for seq in range(2, events + 1)
    )
    LoopStep.objects.create(run=run, seq=1, role="maker", invocation="maker:0", kind="model")
    if spans_stored:
        LoopSpanRecord.objects.create(run=run, recorded_at=finished, spans=3)
    return run


def _types(run: LoopRun) -> list[str]:
    return list(run.events.order_by("seq").values_list("type", flat=True))


class TestEventRetention:
    def test_only_runs_ended_past_the_retention_lose_their_events(self) -> None:
        pattern = make_pattern()
        old = _ended(pattern, days_ago=40)
        recent = _ended(pattern, days_ago=5)
        waiting = make_run(pattern, status=RunStatus.WAITING_APPROVAL, event_seq=1)
        unstored = _ended(pattern, days_ago=40, spans_stored=False)

        report = events_prune(days=30)

        assert (report.runs, report.events, report.more) == (1, 4, False)
        assert _types(old) == ["run.created"]
        old.refresh_from_db()
        assert old.events_pruned_at is not None
        assert old.steps.count() == 1 and LoopSpanRecord.objects.filter(run=old).exists()
        assert len(_types(recent)) == 5 and len(_types(unstored)) == 5
        assert _types(waiting) == ["run.created"]
        for run in (recent, waiting, unstored):
            run.refresh_from_db()
            assert run.events_pruned_at is None
        assert events_prune(days=30).runs == 0  # twice: nothing more

    def test_no_retention_keeps_everything_and_the_task_follows_the_setting(
        self, settings: Any
    ) -> None:
        run = _ended(make_pattern(), days_ago=400)
        assert settings.LOOPWRIGHT["EVENT_RETENTION_DAYS"] == 0
        events_prune_task()
        assert len(_types(run)) == 5
        settings.LOOPWRIGHT = {**settings.LOOPWRIGHT, "EVENT_RETENTION_DAYS": 365}
        events_prune_task()
        assert _types(run) == ["run.created"]

    def test_batches_go_on_until_nothing_is_due(self) -> None:
        pattern = make_pattern()
        runs = [_ended(pattern, days_ago=40, events=2) for _ in range(BATCH_RUNS + 5)]
        report = events_prune(days=30, pause_seconds=0)
        assert (report.runs, report.events) == (BATCH_RUNS + 5, BATCH_RUNS + 5)
        assert (
            LoopRun.objects.filter(id__in=[r.id for r in runs], events_pruned_at=None).count() == 0
        )

    def test_api_and_run_page_say_the_events_were_pruned(self) -> None:
        run = _ended(make_pattern(), days_ago=40)
        events_prune(days=30)
        user = user_ensure(username="retention-viewer", roles=[Role.VIEWER])
        api = Client(HTTP_AUTHORIZATION=f"Bearer {api_token_create(user=user)}")
        detail = api.get(f"/api/v1/runs/{run.id}").json()
        assert detail["events_pruned_at"] is not None
        events = api.get(f"/api/v1/runs/{run.id}/events").json()["results"]
        assert [e["type"] for e in events] == ["run.created"]
        page = Client()
        page.force_login(user)
        html = page.get(f"/runs/{run.id}").content.decode()
        assert 'id="events-pruned"' in html and "were pruned on" in html


@pytest.mark.postgres
class TestEventRetentionSkipsLockedRuns:
    def test_a_run_locked_elsewhere_is_skipped_not_waited_for(self) -> None:
        if connection.vendor != "postgresql":
            pytest.skip("SKIP LOCKED is PostgreSQL's")
        pattern = make_pattern()
        locked, free = _ended(pattern, days_ago=40), _ended(pattern, days_ago=41)
        holding, release = threading.Event(), threading.Event()

        def hold() -> None:
            with transaction.atomic():
                LoopRun.objects.select_for_update().get(pk=locked.pk)
                holding.set()
                release.wait(10)
            connection.close()

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            assert holding.wait(10)
            pruned, _ = events_prune_batch(before=timezone.now() - timedelta(days=30))
        finally:
            release.set()
            holder.join()
        assert pruned == 1
        assert _types(free) == ["run.created"] and len(_types(locked)) == 5
        assert events_prune(days=30).runs == 1  # its turn once released

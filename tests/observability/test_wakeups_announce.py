"""Wake-ups leave after the commit (``orchestrator/wakeups.py``): a listener hears of a run only
once its write is visible, never of a rolled-back one; the engine's own write statements carry
no ``NOTIFY`` (PostgreSQL serialises the commits of transactions that notify), whichever path
the write takes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from loops import db
from loops.models import LoopRun, RunStatus
from loops.services.claims import run_claim
from loops.services.endings import run_transition
from loops.services.steps import step_record
from loops.services.transitions import run_event_append
from orchestrator import wakeups
from tests.support.factories import make_pattern, make_run

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def listener() -> Iterator[psycopg.Connection[Any]]:
    if connection.vendor != "postgresql":
        pytest.skip("wake-ups are PostgreSQL's NOTIFY (on SQLite streams keep the short poll)")
    params = wakeups._listener_params()
    assert params is not None
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute(f"LISTEN {wakeups.CHANNEL}")
        yield conn


def _heard(listener: psycopg.Connection[Any], seconds: float) -> list[str]:
    return [notice.payload for notice in listener.notifies(timeout=seconds)]


def _events_seen_by(listener: psycopg.Connection[Any], run: LoopRun, kind: str) -> int:
    row = listener.execute(
        "SELECT count(*) FROM loops_loopevent WHERE run_id = %s AND type = %s", [run.id, kind]
    ).fetchone()
    assert row is not None
    return int(row[0])


class TestAnnouncedAfterCommit:
    def test_a_write_in_an_atomic_block_is_heard_once_committed_and_visible(
        self, listener: psycopg.Connection[Any]
    ) -> None:
        run = make_run(make_pattern(), status=RunStatus.QUEUED)
        _heard(listener, 0.3)  # what creating the run announced
        with transaction.atomic():
            run_event_append(run_id=run.id, type="test.mark", actor="test", data={})
            assert _heard(listener, 0.3) == []  # nothing before the commit
        assert str(run.id) in _heard(listener, 2.0)
        assert _events_seen_by(listener, run, "test.mark") == 1

    def test_a_rolled_back_write_is_never_heard(self, listener: psycopg.Connection[Any]) -> None:
        run = make_run(make_pattern(), status=RunStatus.QUEUED)
        _heard(listener, 0.3)
        with pytest.raises(RuntimeError), transaction.atomic():
            run_event_append(run_id=run.id, type="test.mark", actor="test", data={})
            raise RuntimeError("rolled back")
        assert str(run.id) not in _heard(listener, 0.5)
        assert _events_seen_by(listener, run, "test.mark") == 0

    def test_a_batch_that_fails_announces_nothing(self, listener: psycopg.Connection[Any]) -> None:
        run = make_run(make_pattern(), status=RunStatus.QUEUED)
        _heard(listener, 0.3)
        with pytest.raises(RuntimeError), db.batch():
            wakeups.touched(run.id)
            raise RuntimeError("rolled back")
        assert str(run.id) not in _heard(listener, 0.5)

    def test_the_engines_writes_send_no_notify_and_every_run_is_heard(
        self, listener: psycopg.Connection[Any]
    ) -> None:
        runs = [make_run(make_pattern(key=f"w{n}"), status=RunStatus.QUEUED) for n in range(3)]
        _heard(listener, 0.3)
        with CaptureQueriesContext(connection) as queries:
            claims = [run_claim(owner="w", lease_seconds=60, run_id=run.id)[0] for run in runs]
            for claim in claims:
                lease = claim.lease
                step_record(
                    lease,
                    role="maker",
                    invocation="maker:0",
                    kind="model",
                    name="m",
                    request={},
                    response={},
                )
                if claim.status == RunStatus.PREPARING:
                    run_transition(
                        run_id=lease.run_id, to=RunStatus.RUNNING, actor="w", lease=lease
                    )
                run_transition(run_id=lease.run_id, to=RunStatus.SUCCEEDED, actor="w", lease=lease)
        sent = [q["sql"] for q in queries.captured_queries]
        assert sent and not [sql for sql in sent if "notify" in sql.lower()]
        heard = _heard(listener, 2.0)
        assert {str(run.id) for run in runs} <= set(heard)
        assert all(r.status == RunStatus.SUCCEEDED for r in LoopRun.objects.filter(pk__in=heard))

    def test_a_burst_is_gathered_and_every_run_heard(
        self, listener: psycopg.Connection[Any]
    ) -> None:
        ids = [f"burst-{n}" for n in range(300)]
        for run_id in ids:
            wakeups.announce([run_id])
        heard = _heard(listener, 2.0)
        assert set(ids) <= set(heard)

    def test_a_steady_announcer_sends_no_health_check_per_notify(
        self, listener: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        checks: list[str] = []
        wrapper = type(connections[DEFAULT_DB_ALIAS])
        original = wrapper.is_usable

        def counted(self: Any) -> bool:
            if threading.current_thread().name == "loopwright-announce":
                checks.append("SELECT 1")
            return bool(original(self))

        monkeypatch.setattr(wrapper, "is_usable", counted)
        sent_before = wakeups.announcer().sent
        ids = [f"steady-{n}" for n in range(20)]
        for run_id in ids:  # farther apart than the announcer gathers: a NOTIFY each, or nearly
            wakeups.announce([run_id])
            time.sleep(wakeups.COALESCE_SECONDS * 2)
        assert set(ids) <= set(_heard(listener, 2.0))
        assert wakeups.announcer().sent - sent_before == len(ids)
        assert checks == []

"""The one-statement claim (PostgreSQL): a run that needs no preparation is claimed straight
into ``running`` (or ``verifying``), both events written, its workspace named in its cursor;
a run that takes path locks, or of a pattern with a concurrency limit, is claimed into
``preparing`` as before. Elsewhere every claim leaves the run ``preparing``."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from loops.models import LoopEvent, LoopRun, RunStatus
from loops.services.claims import run_claim
from loops.services.workspaces import workspace_path
from tests.support.factories import make_pattern, make_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


@pytest.fixture(autouse=True)
def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the one-statement claim is PostgreSQL's (SQLite claims into preparing)")


def events(run: LoopRun) -> list[tuple[int, str, str, str, dict[str, Any]]]:
    """The run's events after its creation's."""
    rows = LoopEvent.objects.filter(run=run).exclude(type="run.created").order_by("seq")
    return [(e.seq, e.type, e.from_status, e.to_status, e.data) for e in rows]


def test_a_run_that_needs_no_preparation_is_claimed_straight_into_running() -> None:
    run = make_run()
    created = run.event_seq
    [claim] = run_claim(owner="w", lease_seconds=60, run_id=run.id)
    run.refresh_from_db()
    workdir = str(workspace_path(run.id))
    assert (claim.status, run.status, claim.lease.token) == ("running", "running", 1)
    assert run.cursor["workdir"] == workdir and run.event_seq == created + 2
    assert events(run) == [
        (created + 1, "lease.claimed", "queued", "preparing", {"token": 1, "attempt": 1}),
        (created + 2, "run.started", "preparing", "running", {"workdir": workdir}),
    ]
    assert claim.columns is not None and claim.columns["goal"] == run.goal


def test_a_run_in_its_verification_phase_is_claimed_into_verifying() -> None:
    run = make_run(cursor={"phase": "verifier", "workdir": "/tmp/somewhere"})
    [claim] = run_claim(owner="w", lease_seconds=60, run_id=run.id)
    run.refresh_from_db()
    assert (claim.status, run.status, run.cursor["workdir"]) == (
        "verifying",
        "verifying",
        "/tmp/somewhere",
    )


def test_a_run_that_takes_path_locks_is_claimed_into_preparing() -> None:
    repository = {"repositoryKey": "repo", "repositoryRoot": "", "actingOn": ["src/"]}
    run = make_run(repository_snapshot=repository)
    [claim] = run_claim(owner="w", lease_seconds=60, run_id=run.id)
    run.refresh_from_db()
    assert (claim.status, run.status, "workdir" in run.cursor) == ("preparing", "preparing", False)
    assert [e[1] for e in events(run)] == ["lease.claimed"]


def test_a_run_whose_worktree_is_not_made_yet_is_claimed_into_preparing() -> None:
    run = make_run(repository_snapshot={"repositoryRoot": "/srv/repo", "baseRef": "main"})
    [claim] = run_claim(owner="w", lease_seconds=60, run_id=run.id)
    assert claim.status == RunStatus.PREPARING


def test_a_run_of_a_pattern_with_a_concurrency_limit_is_counted_and_claimed_into_preparing() -> (
    None
):
    pattern = make_pattern(max_concurrency=1)
    first, second = make_run(pattern), make_run(pattern)
    claims = run_claim(owner="w", lease_seconds=60, limit=5)
    assert [(c.lease.run_id, c.status) for c in claims] == [(first.id, "preparing")]
    assert LoopRun.objects.get(pk=second.id).status == RunStatus.QUEUED


def test_a_claim_takes_no_run_twice_and_returns_the_rest_in_order() -> None:
    runs = sorted((make_run() for _ in range(3)), key=lambda r: r.id)
    claims = run_claim(owner="w", lease_seconds=60, limit=10)
    assert [c.lease.run_id for c in claims] == [r.id for r in runs]
    assert run_claim(owner="other", lease_seconds=60, limit=10) == []

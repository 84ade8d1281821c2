"""Concurrent saves, publishes and creations through the real services, one connection per thread.

On PostgreSQL the profile row lock (SELECT … FOR UPDATE) serialises them; on SQLite the
IMMEDIATE transactions of the settings do. Either way the version history must stay a clean,
gap-free publish trail in which no acknowledged write is lost or lands in a shipped version.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import pytest

from harness.models import HarnessProfile, HarnessProfileVersion, VersionStatus
from harness.services import profile_create, profile_publish, profile_save_draft
from orchestrator.errors import Conflict
from tests.support.threads import in_threads

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

THREADS = 8


def marker(settings: dict[str, Any]) -> int:
    return int(settings["limits"]["maxTokens"])


@pytest.fixture
def crew(transactional_db: None) -> HarnessProfile:
    return profile_create(tag="crew", settings={"limits": {"maxTokens": 0}})


def test_concurrent_first_saves_open_exactly_one_draft(crew: HarnessProfile) -> None:
    results = in_threads(
        THREADS,
        lambda i: profile_save_draft(tag="crew", settings={"limits": {"maxTokens": i + 1}}),
    )
    assert all(isinstance(r, HarnessProfileVersion) for r in results), results
    assert {r.version for r in results} == {2}
    rows = list(HarnessProfileVersion.objects.filter(profile=crew).order_by("version"))
    assert [(v.version, v.status) for v in rows] == [(1, "published"), (2, "draft")]
    assert marker(rows[1].settings) in range(1, THREADS + 1)


def test_concurrent_publishes_ship_the_draft_once(crew: HarnessProfile) -> None:
    profile_save_draft(tag="crew", settings={"limits": {"maxTokens": 7}})
    results = in_threads(THREADS, lambda i: profile_publish(tag="crew"))
    shipped = [r for r in results if isinstance(r, HarnessProfileVersion)]
    refused = [r for r in results if isinstance(r, Conflict)]
    assert len(shipped) == 1 and len(refused) == THREADS - 1, results
    crew.refresh_from_db()
    assert crew.current_version_id == shipped[0].pk
    assert marker(shipped[0].settings) == 7


def test_concurrent_creations_of_one_tag_leave_one_profile() -> None:
    results = in_threads(THREADS, lambda i: profile_create(tag="race", settings={}))
    assert sum(isinstance(r, HarnessProfile) for r in results) == 1
    assert sum(isinstance(r, Conflict) for r in results) == THREADS - 1, results
    assert HarnessProfileVersion.objects.filter(profile__tag="race").count() == 1


def _mixed_work(index: int) -> list[tuple[str, Any]]:
    rng = random.Random(index)  # seeded: reproducible interleavings
    log: list[tuple[str, Any]] = []
    for op in range(12):
        if rng.random() < 0.6:
            value = (index + 1) * 1000 + op
            saved = profile_save_draft(tag="crew", settings={"limits": {"maxTokens": value}})
            log.append(("save", (saved.version, value, saved.updated_at)))
        else:
            try:
                shipped = profile_publish(tag="crew")
            except Conflict:
                log.append(("nothing-to-publish", None))
            else:
                log.append(("publish", (shipped.version, marker(shipped.settings))))
    return log


def test_interleaved_saves_and_publishes_keep_a_clean_history_and_lose_no_write(
    crew: HarnessProfile,
) -> None:
    logs = in_threads(THREADS, _mixed_work)
    assert all(isinstance(log, list) for log in logs), logs
    saves: dict[int, list[tuple[int, Any]]] = defaultdict(list)
    publishes: dict[int, int] = {}
    for kind, data in (entry for log in logs for entry in log):
        if kind == "save":
            saves[data[0]].append((data[1], data[2]))
        elif kind == "publish":
            assert data[0] not in publishes, f"version {data[0]} was published twice"
            publishes[data[0]] = data[1]

    rows = {v.version: v for v in HarnessProfileVersion.objects.filter(profile=crew)}
    numbers = sorted(rows)
    assert numbers == list(range(1, len(numbers) + 1)), "version numbers have gaps"
    drafts = [n for n, v in rows.items() if v.status == VersionStatus.DRAFT]
    assert drafts in ([], [numbers[-1]]), "at most one draft, and it is the newest version"
    assert {n for n, v in rows.items() if v.is_published} == {1, *publishes}
    assert set(saves) == set(numbers) - {1}, "every version came from an acknowledged save"

    for number, row in rows.items():
        if number == 1:
            continue
        written = dict(saves[number])
        # What the version holds is one of the writes acknowledged for it ...
        assert marker(row.settings) in written
        if row.is_published:
            # ... and what was published is what it still holds: nothing wrote into it after.
            assert marker(row.settings) == publishes[number]
            assert all(at <= row.published_at for at in written.values())
    crew.refresh_from_db()
    assert crew.current_version is not None
    assert crew.current_version.version == max(publishes, default=1)

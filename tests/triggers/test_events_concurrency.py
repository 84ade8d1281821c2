"""Deliveries racing with the same Idempotency-Key (or the same signature) start runs once."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection

from loops.models import EventDelivery, LoopRun
from loops.triggers.events import EventAuthFailed, event_deliver
from tests.triggers.conftest import event_pattern

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
THREADS = 6


def race(work: Any) -> list[Any]:
    barrier = threading.Barrier(THREADS)
    results: list[Any] = [None] * THREADS

    def run(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[index] = work(index)
        except Exception as exc:  # every outcome is asserted on
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert not any(t.is_alive() for t in threads)
    return results


def test_concurrent_deliveries_with_one_idempotency_key_start_the_runs_once(
    seeded_profiles: None,
) -> None:
    for n in range(3):
        event_pattern("deploy", key=f"p{n}")
    results = race(
        lambda i: event_deliver(
            event_key="deploy", payload={"n": 1}, principal="ops", idempotency_key="evt-42"
        )
    )
    assert all(not isinstance(r, Exception) for r in results), results
    assert sum(1 for r in results if not r.replayed) == 1
    assert len({r.body["delivery_id"] for r in results}) == 1
    assert LoopRun.objects.count() == 3 and EventDelivery.objects.count() == 1


def test_concurrent_replays_of_one_signed_request_start_the_runs_once(
    seeded_profiles: None,
) -> None:
    event_pattern("deploy")
    results = race(
        lambda i: event_deliver(
            event_key="deploy", payload={"n": 1}, principal="hmac:deploy", signature="ab" * 32
        )
    )
    accepted = [r for r in results if not isinstance(r, Exception)]
    refused = [r for r in results if isinstance(r, EventAuthFailed)]
    assert len(accepted) == 1 and len(refused) == THREADS - 1, results
    assert LoopRun.objects.count() == 1

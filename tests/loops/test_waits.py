"""The pure record of a run's waits (loops/services/waits.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from loops.services.waits import wait_elapsed_seconds, wait_poll, wait_summary

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def test_the_first_poll_starts_a_wait_and_later_polls_only_count() -> None:
    first = wait_poll(None, "lock", T0, {"paths": ["a"]})
    assert first.started and first.record["polls"] == 1
    second = wait_poll(first.record, "lock", T0 + timedelta(seconds=2), {"paths": ["a"]})
    third = wait_poll(second.record, "lock", T0 + timedelta(seconds=7), {"paths": ["b"]})
    assert not second.started and not third.started
    assert third.record["polls"] == 3
    assert third.record["longest_gap_seconds"] == 5.0
    assert third.record["detail"] == {"paths": ["b"]}
    assert third.record["since"] == T0.isoformat()


def test_a_wait_of_another_kind_starts_afresh() -> None:
    lock = wait_poll(None, "lock", T0, {}).record
    model = wait_poll(lock, "model", T0 + timedelta(seconds=30), {"endpoint": "e"})
    assert model.started and model.record["kind"] == "model" and model.record["polls"] == 1


def test_the_summary_counts_the_last_gap_and_the_whole_wait() -> None:
    record = wait_poll(None, "model", T0, {}).record
    record = wait_poll(record, "model", T0 + timedelta(seconds=1), {}).record
    summary = wait_summary(record, T0 + timedelta(seconds=61))
    assert summary is not None
    assert summary["polls"] == 2 and summary["waited_seconds"] == 61.0
    assert summary["longest_gap_seconds"] == 60.0
    assert wait_summary({}, T0) is None
    assert wait_elapsed_seconds(record, T0 + timedelta(seconds=90)) == 90.0


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown wait kind"):
        wait_poll(None, "nap", T0, {})

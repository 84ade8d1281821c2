"""A run's waits (a path lock, a model endpoint that keeps failing), recorded once.

A waiting run is polled again and again; each poll updates the run's ``wait`` record and no
event. The wait writes one event when it starts (its own, e.g. ``lock.waiting``) and one
``wait.ended`` when it ends, carrying :func:`wait_summary`: how many polls, for how long, and
the longest gap between two polls. Pure functions of the stored record and the time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

#: What a run may wait on; the value is ``wait.kind`` and names the ``wait.ended`` summary.
WAIT_KINDS = ("lock", "model")
WAIT_ENDED_EVENT = "wait.ended"


@dataclass(frozen=True)
class WaitPoll:
    """The run's wait record after a poll, and whether this poll started the wait."""

    record: dict[str, Any]
    started: bool


def wait_poll(
    current: Mapping[str, Any] | None, kind: str, now: datetime, detail: Mapping[str, Any]
) -> WaitPoll:
    """Count one poll of a ``kind`` wait at ``now``; a record of another kind (or none) starts
    a new wait. ``detail`` (what the run waits on) replaces the stored one."""
    if kind not in WAIT_KINDS:
        raise ValueError(f"unknown wait kind {kind!r}")
    if not current or current.get("kind") != kind:
        record = {
            "kind": kind,
            "since": now.isoformat(),
            "last_poll": now.isoformat(),
            "polls": 1,
            "longest_gap_seconds": 0.0,
            "detail": dict(detail),
        }
        return WaitPoll(record, started=True)
    gap = max((now - _at(current["last_poll"])).total_seconds(), 0.0)
    record = {
        **current,
        "last_poll": now.isoformat(),
        "polls": int(current.get("polls", 0)) + 1,
        "longest_gap_seconds": round(max(float(current.get("longest_gap_seconds", 0)), gap), 3),
        "detail": dict(detail),
    }
    return WaitPoll(record, started=False)


def wait_elapsed_seconds(current: Mapping[str, Any] | None, now: datetime) -> float:
    """How long the wait has lasted at ``now`` (0 when the run waits on nothing)."""
    if not current:
        return 0.0
    return max((now - _at(current["since"])).total_seconds(), 0.0)


def wait_summary(current: Mapping[str, Any] | None, now: datetime) -> dict[str, Any] | None:
    """The data of the ``wait.ended`` event for the wait ending at ``now``, or None when the
    run was not waiting."""
    if not current:
        return None
    gap = max((now - _at(current["last_poll"])).total_seconds(), 0.0)
    return {
        "kind": current["kind"],
        "since": current["since"],
        "waited_seconds": round(wait_elapsed_seconds(current, now), 3),
        "polls": int(current.get("polls", 0)),
        "longest_gap_seconds": round(max(float(current.get("longest_gap_seconds", 0)), gap), 3),
        "detail": current.get("detail") or {},
    }


def _at(text: str) -> datetime:
    parsed = parse_datetime(text)
    if parsed is None:
        raise ValueError(f"not a timestamp: {text!r}")
    return parsed

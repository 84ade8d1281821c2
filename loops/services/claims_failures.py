"""Why a run's attempts ended: driver errors written to the run, and a true exhaustion reason.

Every claim raises the run's ``attempts``; a clean release (a park, an end) resets it. An
attempt that ends otherwise ends in one of two ways, and the run records which:

* the worker died or was killed: its lease expires and the reaper writes ``lease.expired``;
* the driver raised an error (a bug, a workspace that git refuses): the driver writes
  ``driver.error`` with the error (:func:`run_driver_error`) and the run goes back to the
  queue after a short delay, keeping its attempt count, or fails once the count is spent.

When the attempts are spent, :func:`exhaustion_reason` says what happened in them, counted from
the run's events since the streak began, instead of calling every ending a stopped worker. A
claim within a wait writes no ``lease.claimed``, so the streak is bounded by the attempt numbers
the endings carry as well as by the claims that were logged.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from loops.models import LoopEvent, LoopRun, RunStatus
from loops.services.endings import run_transition
from loops.services.transitions import Lease
from orchestrator.sql import time_in

#: Seconds before a run whose driver raised is claimed again, per attempt so far (capped).
DRIVER_ERROR_RETRY_SECONDS = 2.0
DRIVER_ERROR_RETRY_CAP_SECONDS = 60.0
#: Characters of an error kept in an event and in a failure reason.
ERROR_CHARS = 500


@dataclass
class AttemptEndings:
    """How the attempts of a run's current streak ended (newest error first)."""

    deaths: int = 0
    errors: list[str] = field(default_factory=list)


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of an exception, cut to :data:`ERROR_CHARS`."""
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 1] + "…"


def attempt_endings(run_id: uuid.UUID, attempts: int) -> AttemptEndings:
    """The endings recorded for the run's last ``attempts`` claims (the current streak),
    read back from its events to the claim that began the streak: the logged claim with
    attempt 1, the ``attempts``-th logged claim back, or an ending whose attempt number is not
    below the one after it (it ended an attempt of an earlier streak)."""
    endings = AttemptEndings()
    events = (
        LoopEvent.objects.filter(
            run_id=run_id, type__in=("lease.claimed", "lease.expired", "driver.error")
        )
        .order_by("-seq")
        .values_list("type", "data")
    )
    claims, later = 0, attempts
    for kind, data in events.iterator(chunk_size=100):
        info: dict[str, Any] = data or {}
        if kind == "lease.claimed":
            claims += 1
            if claims >= attempts or int(info.get("attempt") or 0) <= 1:
                break
            continue
        number = _attempt_of(kind, info)
        if number is not None and number >= later:
            break
        if kind == "lease.expired":
            endings.deaths += 1
        else:
            endings.errors.append(str(info.get("error") or "an unknown error"))
        if number is not None:
            if number <= 1:
                break
            later = number
    return endings


def _attempt_of(kind: str, info: dict[str, Any]) -> int | None:
    """The attempt an ending event ended (``driver.error``: ``attempt``, ``lease.expired``:
    ``attempts``), when it says."""
    value = info.get("attempt" if kind == "driver.error" else "attempts")
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def exhaustion_reason(
    endings: AttemptEndings, *, attempts: int, max_attempts: int, status: str
) -> str:
    """The failure reason of a run whose attempts are spent, naming what ended them."""
    limit = f"limit {max_attempts} attempts in a row"
    tail = f"last state was '{status}'."
    if not endings.errors:
        deaths = max(endings.deaths, 1)
        return (
            f"The worker driving the run died or was killed {_times(deaths)} in a row (its "
            f"lease expired each time; {limit}); {tail}"
        )
    distinct = Counter(endings.errors)
    errors = "; ".join(
        f"{error} ({_times(count)})" if len(distinct) > 1 else error
        for error, count in distinct.most_common()
    )
    raised = f"the driver raised an error {_times(len(endings.errors))}: {errors}"
    if not endings.deaths:
        return f"Every attempt failed ({limit}): {raised}; {tail}"
    died = f"the worker died or was killed {_times(endings.deaths)} (its lease expired)"
    return f"The run made {attempts} attempts without progress ({limit}): {raised}; {died}; {tail}"


def reaped_exhaustion_reason(
    run_id: uuid.UUID, *, attempts: int, max_attempts: int, status: str
) -> str:
    """The reaper's reason for a run whose lease expired on its last attempt."""
    endings = attempt_endings(run_id, attempts)
    endings.deaths += 1  # this expiry: the reaper writes its event with the failure
    return exhaustion_reason(endings, attempts=attempts, max_attempts=max_attempts, status=status)


def retry_delay(attempts: int) -> float:
    return min(DRIVER_ERROR_RETRY_SECONDS * max(attempts, 1), DRIVER_ERROR_RETRY_CAP_SECONDS)


@transaction.atomic
def run_driver_error(lease: Lease, error: str) -> str:
    """Write an error the driver raised on a claimed run to the run (fenced by the lease):
    a ``driver.error`` event naming it, and the run back to ``queued`` after
    :func:`retry_delay` (its attempt count kept), or ``failed`` (``driver_error``) with a reason
    that names the error once the attempts are spent. Returns the status the run is left in.

    Raises LeaseLost when the lease is no longer held (whoever holds the run now decides).
    """
    row = LoopRun.objects.filter(pk=lease.run_id).values("status", "attempts", "max_attempts")
    found = row.first()
    if found is None:
        raise LoopRun.DoesNotExist(f"run {lease.run_id} does not exist")
    attempts, max_attempts, status = found["attempts"], found["max_attempts"], found["status"]
    error = error[:ERROR_CHARS]
    data: dict[str, Any] = {"error": error, "attempt": attempts, "state": status}
    if attempts >= max_attempts:
        endings = attempt_endings(lease.run_id, attempts)
        endings.errors.insert(0, error)
        reason = exhaustion_reason(
            endings, attempts=attempts, max_attempts=max_attempts, status=status
        )
        run_transition(
            run_id=lease.run_id,
            to=RunStatus.FAILED,
            actor=lease.owner,
            lease=lease,
            event_type="driver.error",
            data=data,
            fields={"terminal_reason": "driver_error", "failure_reason": reason},
        )
        return RunStatus.FAILED.value
    delay = retry_delay(attempts)
    run_transition(
        run_id=lease.run_id,
        to=RunStatus.QUEUED,
        actor=lease.owner,
        lease=lease,
        event_type="driver.error",
        data={**data, "retry_in_seconds": delay},
        # A driver error is no clean release: the streak of attempts goes on.
        fields={"not_before": time_in(delay), "attempts": attempts},
    )
    return RunStatus.QUEUED.value

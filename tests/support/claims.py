"""Claiming a run the way a worker does, for tests that then act on it through the services."""

from __future__ import annotations

from loops.models import RunStatus
from loops.services.claims import Claimed
from loops.services.transitions import run_transition


def start_claimed(claim: Claimed, **transition: str) -> None:
    """Move a claimed run to ``running``, as the engine's preparation does, unless its claim
    already started it (a run that needs no preparation comes back ``running``).
    ``transition`` is passed to ``run_transition`` (``event_type``)."""
    if claim.status == RunStatus.PREPARING:
        lease = claim.lease
        run_transition(
            run_id=lease.run_id, to=RunStatus.RUNNING, actor=lease.owner, lease=lease, **transition
        )

"""Wake-up calls to workers, sent only after the transaction commits.

A nudge is an optimisation: workers also poll the database, and the reaper re-queues what is
due, so a nudge lost with the broker only delays a run (docs/reliability.md D7).
"""

from __future__ import annotations

import logging
import uuid

from django.db import transaction

logger = logging.getLogger(__name__)


def _send(run_id: str) -> None:
    from loops.tasks import drive_run

    try:
        drive_run.apply_async(args=(run_id,), retry=False)
    except Exception as exc:  # broker down: the poller and the reaper will pick the run up
        logger.warning(
            "could not nudge run %s (%s); workers will find it by polling",
            run_id,
            type(exc).__name__,
        )


def nudge_run(run_id: uuid.UUID | str) -> None:
    """Ask a worker to look at this run once the current transaction has committed."""
    transaction.on_commit(lambda: _send(str(run_id)))

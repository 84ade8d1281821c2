"""Wake-up calls to workers, sent only after the transaction commits.

A nudge is an optimisation: workers also poll the database, and the reaper re-queues what is
due, so a nudge lost with the broker only delays a run (docs/reliability.md D7).
"""

from __future__ import annotations

import uuid

from orchestrator.queue import enqueue


def nudge_run(run_id: uuid.UUID | str) -> None:
    """Ask a worker to look at this run once the current transaction has committed."""
    enqueue("loops.drive_run", str(run_id), retry=False)

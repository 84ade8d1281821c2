"""What an attempt repairs before it uses a run, of what a killed worker can leave behind.

A worker killed while ``bash`` ran had lent the run's workspace to a sandbox uid
(docs/sandbox.md): git refuses such a workspace ("dubious ownership") and the command's files
are not the service user's. Every attempt gives the workspace back before anything uses it,
and the run records that it did.
"""

from __future__ import annotations

import asyncio
import logging

from loops.services.transitions import Lease, run_event_append
from loops.services.workspaces import workspace_lent, workspace_reclaim
from loops.worker.journal import DbThreads

logger = logging.getLogger(__name__)


async def reclaim_workspace(driver: DbThreads, lease: Lease, workdir: str | None) -> None:
    """Give a lent workspace back (its walk off the event loop), recorded first as
    ``workspace.reclaimed``; one ``lstat`` when it is not lent.

    The event is written (fenced) before the walk: an attempt that loses its lease changes
    nothing, and one killed during the walk leaves the top lent (it is given back last), so
    the next attempt records it again. Every lending a kill left is recorded at least once."""
    if not workdir or not workspace_lent(workdir):
        return
    await driver.db(
        run_event_append,
        run_id=lease.run_id,
        type="workspace.reclaimed",
        actor=lease.owner,
        data={"workdir": workdir},
        lease=lease,
    )
    entries = await asyncio.to_thread(workspace_reclaim, workdir)
    logger.info(
        "run %s: workspace %s reclaimed from a sandbox uid (%d entries)",
        lease.run_id,
        workdir,
        entries,
    )

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
    """Give a lent workspace back (its walk off the event loop) and write
    ``workspace.reclaimed`` to the run; one ``lstat`` when it is not lent."""
    if not workdir or not workspace_lent(workdir):
        return
    entries = await asyncio.to_thread(workspace_reclaim, workdir)
    logger.info("run %s: workspace %s reclaimed from a sandbox uid", lease.run_id, workdir)
    await driver.db(
        run_event_append,
        run_id=lease.run_id,
        type="workspace.reclaimed",
        actor=lease.owner,
        data={"workdir": workdir, "entries": entries},
        lease=lease,
    )

"""Conversation checkpoints (``runtime.checkpoint``, docs/tool-loop.md): kept by the
lease holder when an invocation parks; a resume reads the latest with the steps after it."""

from __future__ import annotations

import uuid

from loops import state
from loops.models import ConversationCheckpoint
from loops.services.step_sql import FENCE, STEPS_AFTER, fence_params
from loops.services.steps import record_of_row
from loops.services.transitions import Lease
from orchestrator.sql import execute, fetch_all, now_sql, uuid_param
from runtime.invocation import ResumePoint


def _keep_sql() -> str:
    return (
        "INSERT INTO loops_conversationcheckpoint "  # noqa: S608 (constants)
        "(run_id, invocation, upto_seq, state, updated_at) "
        f"SELECT %s, %s, %s, %s, {now_sql()} "
        f"WHERE EXISTS (SELECT 1 FROM loops_looprun r WHERE {FENCE}) "
        "ON CONFLICT (run_id, invocation) DO UPDATE SET upto_seq = excluded.upto_seq, "
        "state = excluded.state, updated_at = excluded.updated_at"
    )


def checkpoint_keep(lease: Lease, invocation: str, upto_seq: int, state: str) -> bool:
    """Keep ``state`` as the invocation's latest checkpoint (one statement, fenced: a worker
    that lost the run keeps nothing); whether it was kept."""
    params = [uuid_param(lease.run_id), invocation, upto_seq, state, *fence_params(lease)]
    return execute(_keep_sql(), params) == 1


_LATEST = (
    "SELECT upto_seq, state FROM loops_conversationcheckpoint WHERE run_id = %s AND invocation = %s"
)


def resume_point_of(run_id: uuid.UUID, invocation: str) -> ResumePoint:
    """The invocation's latest checkpoint and its steps after it, in order; (None, every
    step) when it has none."""
    run = uuid_param(run_id)
    found = fetch_all(_LATEST, [run, invocation])
    upto, state = (int(found[0][0]), str(found[0][1])) if found else (0, None)
    rows = fetch_all(STEPS_AFTER, [run, invocation, upto])
    return state, [record_of_row(row) for row in rows]


def checkpoints_prune(*, batch: int = 500) -> int:
    """Drop the checkpoints of ended runs (derived rows no resume reads: an ended run never
    resumes), ``batch`` rows a transaction; how many were dropped."""
    ended = [status.value for status in state.TERMINAL]
    dropped = 0
    while True:
        ids = list(
            ConversationCheckpoint.objects.filter(run__status__in=ended).values_list(
                "id", flat=True
            )[:batch]
        )
        if ids:
            ConversationCheckpoint.objects.filter(id__in=ids).delete()
        dropped += len(ids)
        if len(ids) < batch:
            return dropped

"""PostgreSQL's one-statement claim: pick, lease and log claimable runs, and start those that
need no preparation, in one round trip.

``claims.run_claim`` uses it for runs of patterns without a concurrency limit (those are counted
under the pattern's row lock by the exact path). A run needs no preparation when it takes no
path locks (no ``repositoryKey`` or no ``actingOn``) and its workspace is a plain directory or
already exists (its cursor has a ``workdir``): it goes ``queued → preparing → running`` (or
``verifying``) in the same statement, both events written, its cursor given its ``workdir``.
The statement returns what the engine would otherwise read back (``RUN_COLUMNS``), and the
texts the run's limits are read from, so the first invocation's start needs no read of them.

A run in a wait (``wait`` not empty) is claimed quietly, as ``claims._claim_exact`` claims it:
its claim is one more poll of the wait and writes no ``lease.claimed``; a run in a lock wait is
never started by the claim (its start after the locks are taken ends the wait, which the
engine's transition records), and a run in a model wait that needs no preparation starts its
next try quietly (no ``run.started`` either).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from django.utils import timezone

from loops import db
from loops.models import LoopEvent

#: The run columns the claim hands to the engine (``engine.RunState``), JSON ones decoded.
RUN_COLUMNS = (
    "goal",
    "inputs",
    "autonomy_level",
    "role_bindings",
    "harness_snapshots",
    "policy_snapshot",
    "repository_snapshot",
    "cursor",
    "wait",
    "trace_id",
    "triggered_by",
    "instruction_versions",
)
JSON_COLUMNS = frozenset(
    {
        "inputs",
        "role_bindings",
        "harness_snapshots",
        "policy_snapshot",
        "repository_snapshot",
        "cursor",
        "wait",
        "instruction_versions",
    }
)

#: The key of :func:`claimed_columns` under which the texts of the run's limits are.
LIMIT_TEXTS = "limit_texts"
#: The key of the run's pattern.
PATTERN_KEY = "pattern_key"

#: Takes no path locks and has (or gets with a mkdir) its workspace.
_READY = (
    "((COALESCE(r.repository_snapshot->>'repositoryKey', '') = '' "
    "OR jsonb_array_length(COALESCE(r.repository_snapshot->'actingOn', '[]'::jsonb)) = 0) "
    "AND (COALESCE(r.repository_snapshot->>'repositoryRoot', '') = '' OR r.cursor ? 'workdir'))"
)

_CLAIM = f"""
WITH picked AS (
    SELECT r.id, r.status, p.policy AS pattern_policy, p.key AS pattern_key,
           {_READY} AND COALESCE(r.wait->>'kind', '') <> 'lock' AS ready,
           r.wait <> '{{{{}}}}'::jsonb AS quiet
    FROM loops_looprun r JOIN loops_looppattern p ON p.id = r.pattern_id
    WHERE r.status IN ('queued', 'waiting_lock')
      AND (r.not_before IS NULL OR r.not_before <= clock_timestamp())
      AND (r.lease_expires_at IS NULL OR r.lease_expires_at < clock_timestamp())
      AND p.max_concurrency IS NULL {{only}}
    ORDER BY r.id LIMIT %s
    FOR UPDATE OF r SKIP LOCKED
),
taken AS (
    UPDATE loops_looprun r SET
        status = CASE WHEN NOT picked.ready THEN 'preparing'
                      WHEN r.cursor->>'phase' = 'verifier' THEN 'verifying'
                      ELSE 'running' END,
        lease_owner = %s,
        lease_token = r.lease_token + 1,
        lease_expires_at = clock_timestamp() + make_interval(secs => %s),
        heartbeat_at = clock_timestamp(),
        attempts = r.attempts + 1,
        started_at = COALESCE(r.started_at, clock_timestamp()),
        event_seq = r.event_seq + CASE WHEN picked.quiet THEN 0
                                       WHEN picked.ready THEN 2 ELSE 1 END,
        updated_at = clock_timestamp(),
        cursor = CASE WHEN picked.ready AND NOT r.cursor ? 'workdir'
                      THEN jsonb_set(r.cursor, '{{{{workdir}}}}',
                                     to_jsonb(%s || CAST(r.id AS TEXT)))
                      ELSE r.cursor END
    FROM picked WHERE r.id = picked.id
    RETURNING r.id, picked.status AS previous, r.status, r.lease_token, r.event_seq,
              r.attempts, {", ".join(f"r.{c}" for c in RUN_COLUMNS)},
              r.pattern_id, picked.pattern_policy, picked.pattern_key, picked.quiet
),
claimed AS (
    INSERT INTO loops_loopevent (run_id, seq, type, from_status, to_status, actor, data,
                                 created_at)
    SELECT id, event_seq - CASE WHEN status = 'preparing' THEN 0 ELSE 1 END, 'lease.claimed',
           previous, 'preparing', %s,
           jsonb_build_object('token', lease_token, 'attempt', attempts), %s
    FROM taken WHERE NOT quiet
),
started AS (
    INSERT INTO loops_loopevent (run_id, seq, type, from_status, to_status, actor, data,
                                 created_at)
    SELECT id, event_seq, 'run.started', 'preparing', status, %s,
           jsonb_build_object('workdir', cursor->>'workdir'), %s
    FROM taken WHERE status <> 'preparing' AND NOT quiet
)
SELECT id, previous, status, lease_token, attempts, {", ".join(RUN_COLUMNS)},
       pattern_id, pattern_policy, pattern_key
FROM taken ORDER BY id
"""


def claim_statement(
    *,
    owner: str,
    lease_seconds: float,
    limit: int,
    run_ids: Sequence[uuid.UUID] | None,
    workspaces: str,
) -> tuple[str, list[Any]]:
    """The claim of up to ``limit`` runs (of ``run_ids`` only, when given); ``workspaces`` is
    the folder of the runs' workspaces (``<workspaces>/<run id>``, as ``workspace_path``
    builds it)."""
    only = "AND r.id = ANY(%s)" if run_ids is not None else ""
    now = db.prepared(LoopEvent, "created_at", timezone.now())
    params: list[Any] = [*([list(run_ids)] if run_ids is not None else []), limit, owner]
    params += [float(lease_seconds), workspaces.rstrip("/") + "/", owner, now, owner, now]
    return _CLAIM.format(only=only), params


def claimed_columns(row: tuple[Any, ...]) -> dict[str, Any]:
    """The run columns of a row of the claim (after id, previous, status, token, attempts),
    and what the run's limits are read from (``LIMIT_TEXTS``: the pattern id, the policy
    snapshot and the pattern's policy as the database renders them, for their fingerprint)."""
    end = 5 + len(RUN_COLUMNS)
    values = dict(zip(RUN_COLUMNS, row[5:end], strict=True))
    pattern_id, pattern_policy, values[PATTERN_KEY] = row[end:]
    values[LIMIT_TEXTS] = (pattern_id, values["policy_snapshot"], pattern_policy)
    for name in JSON_COLUMNS:
        if isinstance(values[name], str):
            values[name] = json.loads(values[name])
    return values

"""Control-plane tables: patterns, runs and everything a run leaves behind.

Invariants live in the database where they can: unique (run, seq) for events and steps, one fire
per (pattern, scheduled time), check constraints on statuses and counters. Status changes go
through ``loops.services.transitions`` only.
"""

from __future__ import annotations

import os
import time
import uuid

from django.db import models
from django.db.models import Q

from loops.cache_models import SemanticCacheEntry
from loops.choices import (
    ApprovalKind,
    ApprovalStatus,
    AutonomyLevel,
    CronFireOutcome,
    MissedFirePolicy,
    RunStatus,
    StepKind,
    StepStatus,
    TriggerType,
)
from loops.span_models import LoopSpan, LoopSpanRecord, new_trace_id


def uuid7() -> uuid.UUID:
    """A time-ordered UUID (RFC 9562 version 7), so ids sort by creation time."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return uuid.UUID(int=value)


class LoopPattern(models.Model):
    """A repeatable unit of autonomous work; every trigger of it becomes a run."""

    key = models.SlugField(max_length=100, unique=True)
    title = models.CharField(max_length=200, blank=True, default="")
    description = models.TextField(blank=True, default="")
    goal_template = models.TextField()
    autonomy_level = models.CharField(
        max_length=2, choices=AutonomyLevel.choices, default=AutonomyLevel.L1
    )
    trigger_type = models.CharField(
        max_length=10, choices=TriggerType.choices, default=TriggerType.MANUAL
    )
    cron_expression = models.CharField(max_length=100, blank=True, default="")
    timezone = models.CharField(max_length=64, default="UTC")
    missed_fire_policy = models.CharField(
        max_length=10, choices=MissedFirePolicy.choices, default=MissedFirePolicy.COALESCE
    )
    event_key = models.CharField(max_length=100, blank=True, default="", db_index=True)
    leader_username = models.CharField(max_length=150)
    maker_usernames = models.JSONField(default=list)
    verifier_username = models.CharField(max_length=150)
    leader_harness_tag = models.CharField(max_length=100, default="default")
    maker_harness_tag = models.CharField(max_length=100, default="default")
    verifier_harness_tag = models.CharField(max_length=100, default="safe")
    repository_key = models.CharField(max_length=200, blank=True, default="")
    repository_root = models.CharField(max_length=500, blank=True, default="")
    base_ref = models.CharField(max_length=200, blank=True, default="")
    acting_on = models.JSONField(default=list, blank=True)
    policy = models.JSONField(default=dict, blank=True)
    #: Copied from ``policy.concurrency`` on save, so the claim query can read it cheaply.
    max_concurrency = models.PositiveIntegerField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    #: Served as an A2A agent at ``/a2a/<key>`` (``a2a_server``, docs/interop.md).
    a2a_enabled = models.BooleanField(default=False)
    version = models.PositiveIntegerField(default=1)
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["key"]

    def __str__(self) -> str:
        return self.key


class LoopRun(models.Model):
    """One durable execution of a pattern. The row is the unit of work; Celery only nudges.

    Lease fields: ``lease_owner`` names the worker driving the run, ``lease_token`` is the
    fencing token (incremented at every claim and whenever a human takes the run away), and
    ``lease_expires_at`` is computed from the database clock. Every write of a worker is
    conditional on its token.
    """

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    # Indexed by loops_run_pattern_status (pattern, status), which serves pattern lookups too.
    pattern = models.ForeignKey(
        LoopPattern, on_delete=models.PROTECT, related_name="runs", db_index=False
    )
    pattern_version = models.PositiveIntegerField(default=1)
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.QUEUED)
    trigger_type = models.CharField(max_length=10, default=TriggerType.MANUAL)
    triggered_by = models.CharField(max_length=200, blank=True, default="")
    trigger_ref = models.CharField(max_length=200, blank=True, default="")
    inputs = models.JSONField(default=dict, blank=True)
    goal = models.TextField(blank=True, default="")
    autonomy_level = models.CharField(max_length=2, default=AutonomyLevel.L1)
    role_bindings = models.JSONField(default=dict)
    harness_snapshots = models.JSONField(default=dict, blank=True)
    policy_snapshot = models.JSONField(default=dict, blank=True)
    repository_snapshot = models.JSONField(default=dict, blank=True)
    cursor = models.JSONField(default=dict, blank=True)
    result = models.JSONField(null=True, blank=True)
    terminal_reason = models.CharField(max_length=60, blank=True, default="")
    failure_reason = models.TextField(blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=5)
    lease_owner = models.CharField(max_length=200, null=True, blank=True)
    lease_token = models.BigIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    not_before = models.DateTimeField(null=True, blank=True)
    #: The wait the run is in (a path lock, a model endpoint), as ``loops.services.waits``
    #: records it: written on every poll, announced by one event when it starts and one when it
    #: ends; ``{}`` when the run waits on nothing.
    wait = models.JSONField(default=dict, blank=True)
    event_seq = models.PositiveIntegerField(default=0)
    step_count = models.PositiveIntegerField(default=0)
    #: The lease token under which the run's current model call was admitted against its
    #: pattern's daily budget; cleared when the call is charged. A value other than
    #: ``lease_token`` belongs to a dead lease and holds nothing (``loops.services.budgets``).
    model_call_token = models.BigIntegerField(null=True, blank=True)
    #: W3C trace id of the run's spans: the caller's (``traceparent``) or a new one.
    trace_id = models.CharField(max_length=32, default=new_trace_id)
    #: ``{name: version}`` of the unversioned instruction references, fixed at start (prompts.md).
    instruction_versions = models.JSONField(default=dict, blank=True)
    retry_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retries"
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    #: When the run's events (all but ``run.created``) were pruned past the retention.
    events_pruned_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # Retention walks ended runs whose events are still there, oldest first.
            models.Index(
                fields=["finished_at"],
                name="loops_run_events_kept",
                condition=Q(finished_at__isnull=False, events_pruned_at__isnull=True),
            ),
            # The claim query scans queued/waiting_lock runs in due order.
            models.Index(
                fields=["id"],
                name="loops_run_claimable",
                condition=Q(status__in=["queued", "waiting_lock"]),
            ),
            models.Index(fields=["pattern", "status"], name="loops_run_pattern_status"),
            # A plain index (db_index=True would add a second, LIKE-only one on PostgreSQL).
            models.Index(fields=["status"], name="loops_run_status"),
            # The reaper's expired leases. Its predicate is one no fence implies: on
            # ``lease_owner IS NOT NULL`` a fence (``id = … AND lease_owner = …``) could be
            # planned as a scan of every leased run instead of the primary key lookup.
            models.Index(
                fields=["lease_expires_at"],
                name="loops_run_leased",
                condition=Q(lease_expires_at__isnull=False),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=[s.value for s in RunStatus]), name="loops_run_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(lease_owner__isnull=True) | Q(lease_expires_at__isnull=False),
                name="loops_run_lease_has_expiry",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pattern_id}:{self.id}"


class LoopEvent(models.Model):
    """Append-only history of a run; ``seq`` increases by one per event within a run."""

    # Indexed by the (run, seq) unique constraint, which serves run lookups too.
    run = models.ForeignKey(
        LoopRun, on_delete=models.CASCADE, related_name="events", db_index=False
    )
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=60)
    from_status = models.CharField(max_length=20, blank=True, default="")
    to_status = models.CharField(max_length=20, blank=True, default="")
    actor = models.CharField(max_length=200, blank=True, default="")
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="loops_event_run_seq_unique")
        ]
        # The metrics page's retries by day (only those events are in it).
        indexes = [
            models.Index(
                fields=["created_at"],
                name="loops_event_retry_later",
                condition=Q(type="run.retry_later"),
            )
        ]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.type}"


class LoopStep(models.Model):
    """One persisted unit of an invocation: a model step or a tool call.

    A tool step with ``status=started`` and no result is a call that may have run: on resume it
    is re-issued with the same ``idempotency_key``. A completed step is never re-executed."""

    # Indexed by the (run, seq) unique constraint, which serves run lookups too.
    run = models.ForeignKey(LoopRun, on_delete=models.CASCADE, related_name="steps", db_index=False)
    seq = models.PositiveIntegerField()
    role = models.CharField(max_length=20)
    invocation = models.CharField(max_length=100)
    kind = models.CharField(max_length=10, choices=StepKind.choices)
    status = models.CharField(max_length=10, choices=StepStatus.choices)
    name = models.CharField(max_length=200, blank=True, default="")
    idempotency_key = models.CharField(max_length=200, blank=True, default="")
    request = models.JSONField(default=dict, blank=True)
    response = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    lease_token = models.BigIntegerField(default=0)
    #: Tool steps: SHA-256 of the tool name and canonical arguments, so the run-level tool-loop
    #: policy counts identical calls across invocations and resumes (``services.tool_repeats``).
    call_hash = models.CharField(max_length=64, null=True, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="loops_step_run_seq_unique"),
        ]
        indexes = [
            models.Index(
                fields=["run", "call_hash"],
                name="loops_step_call_hash",
                condition=Q(call_hash__isnull=False),
            ),
            # The metrics page's days of tokens and cost, and its model failures.
            models.Index(fields=["started_at"], name="loops_step_started"),
            models.Index(
                fields=["started_at"],
                name="loops_step_model_failed",
                condition=Q(kind="model") & ~Q(error=""),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.kind}:{self.name}"


class ConversationCheckpoint(models.Model):
    """An invocation's settled history folded once (``runtime.checkpoint``), kept by the lease
    holder when the invocation parks: a resume reads it and only the steps after ``upto_seq``.
    ``state`` is the checkpoint's JSON as text (PostgreSQL's jsonb refuses NUL characters that
    a tool call's arguments may hold)."""

    run = models.ForeignKey(LoopRun, on_delete=models.CASCADE, db_index=False)
    invocation = models.CharField(max_length=100)
    upto_seq = models.PositiveIntegerField()
    state = models.TextField()
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "invocation"], name="loops_checkpoint_run_invocation_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} {self.invocation} <= {self.upto_seq}"


class LoopArtifact(models.Model):
    run = models.ForeignKey(LoopRun, on_delete=models.CASCADE, related_name="artifacts")
    kind = models.CharField(max_length=40)
    name = models.CharField(max_length=200)
    content_type = models.CharField(max_length=100, default="text/plain")
    content = models.TextField(blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "created_at"]

    def __str__(self) -> str:
        return f"{self.run_id}:{self.name}"


class PathLock(models.Model):
    """A run's hold on a path of a repository (``actingOn``); overlapping paths conflict."""

    run = models.ForeignKey(LoopRun, on_delete=models.CASCADE, related_name="path_locks")
    repository_key = models.CharField(max_length=200)
    path = models.CharField(max_length=500)
    acquired_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["repository_key", "path"], name="loops_pathlock_repo_path_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.repository_key}:{self.path} ({self.run_id})"


class UsageBucket(models.Model):
    """Atomic counters per scope (a run, or a pattern and day) and metric."""

    scope = models.CharField(max_length=120)
    metric = models.CharField(max_length=40)
    value = models.DecimalField(max_digits=18, decimal_places=6, default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope", "metric"], name="loops_usage_scope_metric")
        ]

    def __str__(self) -> str:
        return f"{self.scope}:{self.metric}={self.value}"


class CircuitState(models.Model):
    """A pattern's circuit breaker (key ``pattern:<pattern key>``), shared by every process."""

    key = models.CharField(max_length=200, unique=True)
    state = models.CharField(max_length=10, default="closed")
    consecutive_failures = models.PositiveIntegerField(default=0)
    opened_at = models.DateTimeField(null=True, blank=True)
    cooldown_seconds = models.PositiveIntegerField(default=60)
    probe_owner = models.CharField(max_length=200, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.key}:{self.state}"


__all__ = [
    "AutonomyLevel",
    "CircuitState",
    "LoopArtifact",
    "LoopEvent",
    "LoopPattern",
    "LoopRun",
    "LoopStep",
    "PathLock",
    "RunStatus",
    "StepKind",
    "StepStatus",
    "TriggerType",
    "UsageBucket",
    "uuid7",
]


class ActionApproval(models.Model):
    """A gated tool call waiting for (or having had) a human decision, or a question a running
    call asked (``kind`` ``input``; ``reason`` is the question, ``answer`` what a person said).
    A step has at most one pending approval; a call that asks again gets a new one.

    ``proposal_hash`` binds the decision to exactly this call: tool name, canonical arguments,
    run, step and harness version. ``executed_hash`` is written when the approved call runs, so
    an audit can prove that what ran is what was approved (docs/reliability.md A2). The forms a
    person saw (``interaction_schema``, ``review_schema``) are captured when it opens; ``review``
    is what the reviewer filled, valid against ``review_schema`` (docs/approvals.md)."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    run = models.ForeignKey(LoopRun, on_delete=models.CASCADE, related_name="approvals")
    step_seq = models.PositiveIntegerField()
    role = models.CharField(max_length=20)
    invocation = models.CharField(max_length=100)
    employee_username = models.CharField(max_length=150, blank=True, default="")
    tool_name = models.CharField(max_length=200)
    kind = models.CharField(max_length=10, choices=ApprovalKind.choices, default=ApprovalKind.CALL)
    arguments = models.JSONField(default=dict)
    reason = models.TextField(blank=True, default="")
    answer = models.TextField(blank=True, default="")
    proposal_hash = models.CharField(max_length=64)
    policy_version = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(
        max_length=10, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING
    )
    decided_input = models.JSONField(null=True, blank=True)
    interaction_schema = models.JSONField(null=True, blank=True)
    review_schema = models.JSONField(null=True, blank=True)
    review = models.JSONField(null=True, blank=True)
    decided_by = models.CharField(max_length=150, blank=True, default="")
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True, default="")
    approved_hash = models.CharField(max_length=64, blank=True, default="")
    executed_hash = models.CharField(max_length=64, blank=True, default="")
    executed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "step_seq"],
                name="loops_approval_run_step_pending",
                condition=Q(status="pending"),
            ),
            models.CheckConstraint(
                condition=Q(kind__in=[k.value for k in ApprovalKind]),
                name="loops_approval_kind_valid",
            ),
            models.CheckConstraint(
                condition=Q(status__in=[s.value for s in ApprovalStatus]),
                name="loops_approval_status_valid",
            ),
        ]
        indexes = [
            models.Index(fields=["expires_at"], name="loops_approval_pending_expiry",
                         condition=Q(status="pending"))
        ]  # fmt: skip

    def __str__(self) -> str:
        return f"{self.tool_name} ({self.status}) for {self.run_id}"


# --- Triggers: cron schedules and fires, event keys and deliveries ---------------------------


class CronSchedule(models.Model):
    """Where a cron pattern's schedule stands: the next fire time the scheduler tick waits for.

    One row per cron pattern, kept in step by ``loops.triggers.scheduler.cron_schedule_sync``.
    The tick reads only rows whose ``next_fire_at`` is due (a partial index), so its cost follows
    the number of due patterns, not the number of patterns. ``expression``, ``timezone`` and
    ``enabled`` are the pattern values the row was computed from; the tick recomputes a row
    whose pattern no longer matches them. ``next_fire_at`` is NULL while the schedule is paused
    (``paused_reason`` says why: the pattern is disabled, or is no longer a cron pattern).
    """

    pattern = models.OneToOneField(
        LoopPattern, on_delete=models.CASCADE, related_name="cron_schedule"
    )
    expression = models.CharField(max_length=100, blank=True, default="")
    timezone = models.CharField(max_length=64, default="UTC")
    enabled = models.BooleanField(default=True)
    next_fire_at = models.DateTimeField(null=True, blank=True)
    #: The scheduled time of the last fire recorded (started or refused).
    last_fired_at = models.DateTimeField(null=True, blank=True)
    paused_reason = models.CharField(max_length=200, blank=True, default="")
    #: Due times folded into a later fire (coalesce) or dropped (skip), since the row was made.
    missed_total = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["next_fire_at"],
                name="loops_cron_due",
                condition=Q(next_fire_at__isnull=False),
            )
        ]

    def __str__(self) -> str:
        return f"{self.pattern_id} next {self.next_fire_at}"


class CronFire(models.Model):
    """One fire of a cron pattern. At most one row per (pattern, scheduled time): the row is
    inserted before the run, in the same transaction, so two schedulers cannot both start it
    and a crash between the two writes loses neither (both roll back together)."""

    pattern = models.ForeignKey(LoopPattern, on_delete=models.CASCADE, related_name="cron_fires")
    scheduled_for = models.DateTimeField()
    fired_at = models.DateTimeField()
    outcome = models.CharField(max_length=10, choices=CronFireOutcome.choices)
    reason = models.TextField(blank=True, default="")
    run = models.OneToOneField(
        LoopRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="cron_fire"
    )
    #: Earlier due times folded into this fire (coalesce) or dropped before it (skip).
    missed = models.PositiveIntegerField(default=0)
    #: Which scheduler process recorded the fire (host:pid), for audits.
    scheduler = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["-scheduled_for"]
        constraints = [
            models.UniqueConstraint(
                fields=["pattern", "scheduled_for"], name="loops_cronfire_pattern_time_unique"
            ),
            models.CheckConstraint(
                condition=Q(outcome__in=[o.value for o in CronFireOutcome]),
                name="loops_cronfire_outcome_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pattern_id}@{self.scheduled_for.isoformat()} {self.outcome}"


class EventKey(models.Model):
    """A named event source (``POST /api/v1/events/{key}``) and the secret its webhooks sign.

    SECURITY: ``secret`` is stored as given, not hashed, on purpose: verifying an HMAC needs the
    secret itself. The API returns it once (when the key is created or rotated) and never again;
    treat database dumps as holding these secrets.
    """

    key = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True, default="")
    secret = models.CharField(max_length=128)
    #: Signed deliveries whose timestamp is further than this from the server's clock are refused.
    tolerance_seconds = models.PositiveIntegerField(default=300)
    enabled = models.BooleanField(default=True)
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    rotated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["key"]

    def __str__(self) -> str:
        return self.key


class EventDelivery(models.Model):
    """One accepted event delivery and what it started; a retry carrying the same
    ``Idempotency-Key`` gets ``response`` back instead of new runs."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    event_key = models.CharField(max_length=100)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    #: ``user:<username>`` for an API token, ``hmac:<event key>`` for a signed delivery.
    principal = models.CharField(max_length=200)
    #: SHA-256 of the canonical JSON of the payload: a reused key with another payload is a 409.
    payload_hash = models.CharField(max_length=64)
    #: The HMAC of a signed delivery, so that the same signed request cannot start runs twice.
    signature = models.CharField(max_length=64, null=True, blank=True)
    run_ids = models.JSONField(default=list, blank=True)
    response = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["event_key", "idempotency_key"],
                name="loops_delivery_idempotency_unique",
                condition=Q(idempotency_key__isnull=False),
            ),
            models.UniqueConstraint(
                fields=["event_key", "signature"],
                name="loops_delivery_signature_unique",
                condition=Q(signature__isnull=False),
            ),
        ]
        indexes = [models.Index(fields=["event_key", "created_at"], name="loops_delivery_key_time")]

    def __str__(self) -> str:
        return f"{self.event_key}:{self.id}"


__all__ += ["CronFire", "CronFireOutcome", "CronSchedule", "EventDelivery", "EventKey", "LoopSpan"]
__all__ += ["LoopSpanRecord", "SemanticCacheEntry"]

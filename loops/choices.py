"""The closed sets of values of the control-plane tables (``loops.models`` uses and re-exports
them); the database checks the statuses with constraints built from them."""

from __future__ import annotations

from django.db import models


class AutonomyLevel(models.TextChoices):
    L1 = "L1", "L1 supervised"
    L2 = "L2", "L2"
    L3 = "L3", "L3 autonomous"


class TriggerType(models.TextChoices):
    MANUAL = "manual"
    CRON = "cron"
    EVENT = "event"


class MissedFirePolicy(models.TextChoices):
    COALESCE = "coalesce"
    SKIP = "skip"


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    PREPARING = "preparing"
    WAITING_LOCK = "waiting_lock"
    RUNNING = "running"
    WAITING_APPROVAL = "waiting_approval"
    VERIFYING = "verifying"
    WAITING_HUMAN = "waiting_human"
    PAUSED = "paused"
    BLOCKED = "blocked"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"


class StepKind(models.TextChoices):
    MODEL = "model"
    TOOL = "tool"
    NOTICE = "notice"


class StepStatus(models.TextChoices):
    STARTED = "started"
    COMPLETED = "completed"
    FAILED = "failed"
    #: A tool call that policy gates: it waits for an approval decision and has not run.
    GATED = "gated"
    #: A gated call a human approved (``request`` then holds the approved arguments).
    APPROVED = "approved"


class ApprovalStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    #: The run ended (canceled, failed) before anyone decided: nothing is left to decide.
    WITHDRAWN = "withdrawn"


class ApprovalKind(models.TextChoices):
    #: A tool call the policy gates: approve (maybe with edited arguments) or reject.
    CALL = "call"
    #: A running call asked a question (a remote agent's ``input-required``): answer or reject.
    INPUT = "input"


class CronFireOutcome(models.TextChoices):
    STARTED = "started"
    REFUSED = "refused"

"""Input and output shapes of the loops API (validation of rules lives in the services)."""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from harness.serializers import HarnessLayerField, StrictInput
from loops import state
from loops.models import (
    ActionApproval,
    AutonomyLevel,
    LoopArtifact,
    LoopEvent,
    LoopPattern,
    LoopRun,
    LoopStep,
    MissedFirePolicy,
    TriggerType,
)
from loops.services.budgets import run_budget_usage
from loops.services.runs import run_harness_notices
from loops.triggers.scheduler import pattern_next_fire_at
from orchestrator.strict import StrictModelSerializer, StrictSerializer


class PatternSerializer(StrictModelSerializer[LoopPattern]):
    maker_usernames = serializers.ListField(
        child=serializers.CharField(max_length=150), allow_empty=True, required=False
    )
    acting_on = serializers.ListField(
        child=serializers.CharField(max_length=500), allow_empty=True, required=False
    )
    policy = serializers.JSONField(
        required=False, help_text="Pattern policy (see docs/patterns.md)."
    )
    autonomy_level = serializers.ChoiceField(choices=AutonomyLevel.choices, required=False)
    trigger_type = serializers.ChoiceField(choices=TriggerType.choices, required=False)
    missed_fire_policy = serializers.ChoiceField(choices=MissedFirePolicy.choices, required=False)
    next_fire_at = serializers.SerializerMethodField(
        help_text="When a cron pattern fires next (null when paused, disabled or not cron)."
    )
    a2a_enabled = serializers.BooleanField(
        required=False,
        help_text=(
            "Serve the pattern as an A2A agent: JSON-RPC at `/a2a/<key>`, its agent card at "
            "`/a2a/<key>/.well-known/agent-card.json`; a message starts a run (docs/interop.md)."
        ),
    )

    class Meta:
        model = LoopPattern
        fields = [
            "key", "title", "description", "goal_template", "autonomy_level", "trigger_type",
            "cron_expression", "timezone", "missed_fire_policy", "event_key", "leader_username",
            "maker_usernames", "verifier_username", "leader_harness_tag", "maker_harness_tag",
            "verifier_harness_tag", "repository_key", "repository_root", "base_ref", "acting_on",
            "policy", "enabled", "a2a_enabled", "version", "next_fire_at", "created_by",
            "created_at", "updated_at",
        ]  # fmt: skip
        read_only_fields = ["version", "created_by", "created_at", "updated_at"]

    def get_next_fire_at(self, pattern: LoopPattern) -> datetime | None:
        return pattern_next_fire_at(pattern)

    def validate_policy(self, value: Any) -> Any:
        if not isinstance(value, dict):
            raise serializers.ValidationError("policy must be a JSON object.")
        return value


class PatternUpdateSerializer(PatternSerializer):
    class Meta(PatternSerializer.Meta):
        read_only_fields = ["key", "version", "created_by", "created_at", "updated_at"]


class TriggerSerializer(StrictInput):
    """Unknown fields are refused: a misspelt ``harness_overrides`` must not start a run
    without them."""

    inputs = serializers.DictField(
        required=False, default=dict, help_text="Values for the goal template."
    )
    harness_overrides = HarnessLayerField(
        required=False,
        help_text=(
            "The run's own harness layer (`run`), stacked last on every role: it can only "
            "tighten. A value looser than an earlier layer's is not applied and is listed in "
            "the run's `harness_notices`. Problems point into it (`/harness_overrides/limits/"
            "maxInvocations`)."
        ),
    )


class HarnessPreviewSerializer(StrictInput):
    harness_overrides = HarnessLayerField(
        required=False, help_text="The run overrides to preview, as for a trigger."
    )


class HarnessNoticeSerializer(StrictSerializer):
    role = serializers.ChoiceField(choices=["leader", "maker", "verifier"])
    employee = serializers.CharField()
    field = serializers.CharField(help_text="The setting, e.g. `limits.maxInvocations`.")
    asked = serializers.JSONField(help_text="The value the run's overrides asked for.")
    got = serializers.JSONField(help_text="The value the role runs with.")
    decidedBy = serializers.CharField(help_text="The layer that set it, e.g. `profile:tight@1`.")


class HarnessPreviewResultSerializer(StrictSerializer):
    harness_snapshots = serializers.JSONField(
        help_text=(
            "Per role, exactly what a run triggered now with these overrides would pin: "
            "`{leader, makers: {username: ...}, verifier}`, each `{profile, settings, "
            "provenance, layers}`."
        )
    )
    harness_notices = HarnessNoticeSerializer(many=True)


class ActionSerializer(StrictSerializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class RunSerializer(StrictModelSerializer[LoopRun]):
    pattern: serializers.SlugRelatedField[LoopPattern] = serializers.SlugRelatedField(
        slug_field="key", read_only=True
    )
    allowed_actions = serializers.SerializerMethodField()

    class Meta:
        model = LoopRun
        fields = [
            "id", "pattern", "pattern_version", "status", "trigger_type", "triggered_by",
            "trigger_ref", "inputs", "goal", "autonomy_level", "role_bindings", "cursor",
            "result", "terminal_reason", "failure_reason", "wait", "attempts", "max_attempts",
            "lease_owner", "lease_expires_at", "heartbeat_at", "step_count", "retry_of",
            "instruction_versions",
            "created_at", "started_at", "finished_at", "updated_at", "allowed_actions",
        ]  # fmt: skip
        read_only_fields = fields
        extra_kwargs = {
            "instruction_versions": {
                "help_text": (
                    "`{name: version}` of the instructions the run's prompts reference without "
                    "a version, fixed when it started (a retry keeps them; docs/prompts.md)."
                )
            },
            "wait": {
                "help_text": (
                    "The wait the run is in ({} when none): kind (lock|model), since, "
                    "last_poll, polls, longest_gap_seconds, detail (what it waits on)."
                )
            },
        }

    def get_allowed_actions(self, obj: LoopRun) -> list[str]:
        return state.allowed_actions(obj.status)


@extend_schema_field(HarnessNoticeSerializer(many=True))
class HarnessNoticesField(serializers.Field[Any, Any, list[dict[str, Any]], LoopRun]):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("source", "*")
        kwargs.setdefault("read_only", True)
        kwargs.setdefault(
            "help_text",
            "What the run's harness overrides asked for and did not get, because an earlier "
            "layer is stricter: `[{role, employee, field, asked, got, decidedBy}]`.",
        )
        super().__init__(**kwargs)

    def to_representation(self, value: LoopRun) -> list[dict[str, Any]]:
        return run_harness_notices(value)


class TriggeredRunSerializer(RunSerializer):
    """A run just started (trigger, retry), with its harness notices."""

    harness_notices = HarnessNoticesField()

    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "harness_notices"]
        read_only_fields = fields


def triggered_run_data(run: LoopRun) -> dict[str, Any]:
    """``TriggeredRunSerializer(run).data``, rendered by one serializer whose fields are built
    once (DRF builds them per instance: ~0.5 ms). Its fields keep nothing of a run and it has
    no context, so every request and thread may share it."""
    return dict(_triggered_run_serializer().to_representation(run))


@functools.cache
def _triggered_run_serializer() -> TriggeredRunSerializer:
    return TriggeredRunSerializer()  # DRF keeps its fields once built (``fields`` is cached)


class RunDetailSerializer(RunSerializer):
    budget_usage = serializers.SerializerMethodField(
        help_text=(
            "Usage against limits: perRun (this run) and daily (its pattern today, UTC), each "
            "{scope, <metric>: {used, limit}} for invocations, toolCalls, delegations, "
            "verifications, tokens and cost (limit null: unbounded)."
        )
    )

    harness_notices = HarnessNoticesField()

    class Meta(RunSerializer.Meta):
        fields = [
            *RunSerializer.Meta.fields,
            "harness_snapshots",
            "harness_notices",
            "policy_snapshot",
            "repository_snapshot",
            "budget_usage",
            "events_pruned_at",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "events_pruned_at": {
                "help_text": "When the run's events, all but `run.created`, were pruned past "
                "LOOPWRIGHT_EVENT_RETENTION_DAYS (null: all kept). Steps, approvals and stored "
                "spans stay."
            }
        }

    def get_budget_usage(self, obj: LoopRun) -> dict[str, Any]:
        return run_budget_usage(obj)


class BudgetRaiseSerializer(StrictSerializer):
    perRun = serializers.DictField(  # the policy's own spelling
        help_text=(
            "Per-run limits to raise, as in the pattern policy's budgets.perRun (invocations, "
            "toolCalls, delegations, verifications, tokens, cost); null removes a limit. "
            "Lowering is refused."
        )
    )


class EventSerializer(StrictModelSerializer[LoopEvent]):
    class Meta:
        model = LoopEvent
        fields = ["seq", "type", "from_status", "to_status", "actor", "data", "created_at"]
        read_only_fields = fields


class StepSerializer(StrictModelSerializer[LoopStep]):
    class Meta:
        model = LoopStep
        fields = [
            "seq", "role", "invocation", "kind", "status", "name", "idempotency_key", "request",
            "response", "error", "tokens_in", "tokens_out", "cost", "started_at", "finished_at",
            "duration_ms",
        ]  # fmt: skip
        read_only_fields = fields


class ArtifactSerializer(StrictModelSerializer[LoopArtifact]):
    class Meta:
        model = LoopArtifact
        fields = ["id", "kind", "name", "content_type", "content", "metadata", "created_at"]
        read_only_fields = fields


class ApprovalSerializer(StrictModelSerializer[ActionApproval]):
    pattern = serializers.CharField(source="run.pattern.key", read_only=True)
    goal = serializers.CharField(source="run.goal", read_only=True)

    class Meta:
        model = ActionApproval
        fields = [
            "id", "run", "pattern", "goal", "step_seq", "role", "invocation", "employee_username",
            "tool_name", "kind", "arguments", "reason", "answer", "status", "policy_version",
            "proposal_hash", "interaction_schema", "review_schema", "review",
            "decided_input", "decided_by", "decided_at", "decision_reason", "approved_hash",
            "executed_hash", "executed_at", "expires_at", "created_at",
        ]  # fmt: skip
        read_only_fields = fields


class DecideSerializer(StrictSerializer):
    decision = serializers.ChoiceField(
        choices=["approve", "reject", "answer"],
        help_text="`approve` or `reject` a gated call; `answer` or `reject` a question "
        "(`kind` `input`).",
    )
    input = serializers.JSONField(
        required=False, allow_null=True, default=None, help_text="Edited tool arguments."
    )
    answer = serializers.CharField(
        required=False,
        allow_null=True,
        default=None,
        max_length=10_000,
        help_text="The answer to a question a call asked (with decision `answer`).",
    )
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)
    review = serializers.JSONField(
        required=False,
        allow_null=True,
        default=None,
        help_text="The review, valid against the approval's `review_schema`: required to approve "
        "or reject an approval that has one, refused on one that has none.",
    )

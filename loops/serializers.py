"""Input and output shapes of the loops API (validation of rules lives in the services)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rest_framework import serializers

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
from loops.triggers.scheduler import pattern_next_fire_at


class PatternSerializer(serializers.ModelSerializer[LoopPattern]):
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

    class Meta:
        model = LoopPattern
        fields = [
            "key", "title", "description", "goal_template", "autonomy_level", "trigger_type",
            "cron_expression", "timezone", "missed_fire_policy", "event_key", "leader_username",
            "maker_usernames", "verifier_username", "leader_harness_tag", "maker_harness_tag",
            "verifier_harness_tag", "repository_key", "repository_root", "base_ref", "acting_on",
            "policy", "enabled", "version", "next_fire_at", "created_by", "created_at",
            "updated_at",
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


class TriggerSerializer(serializers.Serializer[Any]):
    inputs = serializers.DictField(
        required=False, default=dict, help_text="Values for the goal template."
    )


class ActionSerializer(serializers.Serializer[Any]):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class RunSerializer(serializers.ModelSerializer[LoopRun]):
    pattern: serializers.SlugRelatedField[LoopPattern] = serializers.SlugRelatedField(
        slug_field="key", read_only=True
    )
    allowed_actions = serializers.SerializerMethodField()

    class Meta:
        model = LoopRun
        fields = [
            "id", "pattern", "pattern_version", "status", "trigger_type", "triggered_by",
            "trigger_ref", "inputs", "goal", "autonomy_level", "role_bindings", "cursor",
            "result", "terminal_reason", "failure_reason", "attempts", "max_attempts",
            "lease_owner", "lease_expires_at", "heartbeat_at", "step_count", "retry_of",
            "created_at", "started_at", "finished_at", "updated_at", "allowed_actions",
        ]  # fmt: skip
        read_only_fields = fields

    def get_allowed_actions(self, obj: LoopRun) -> list[str]:
        return state.allowed_actions(obj.status)


class RunDetailSerializer(RunSerializer):
    budget_usage = serializers.SerializerMethodField(
        help_text=(
            "Usage against limits: perRun (this run) and daily (its pattern today, UTC), each "
            "{scope, <metric>: {used, limit}} for invocations, toolCalls, delegations, "
            "verifications, tokens and cost (limit null: unbounded)."
        )
    )

    class Meta(RunSerializer.Meta):
        fields = [
            *RunSerializer.Meta.fields,
            "harness_snapshots",
            "policy_snapshot",
            "repository_snapshot",
            "budget_usage",
        ]
        read_only_fields = fields

    def get_budget_usage(self, obj: LoopRun) -> dict[str, Any]:
        return run_budget_usage(obj)


class BudgetRaiseSerializer(serializers.Serializer[Any]):
    perRun = serializers.DictField(  # the policy's own spelling
        help_text=(
            "Per-run limits to raise, as in the pattern policy's budgets.perRun (invocations, "
            "toolCalls, delegations, verifications, tokens, cost); null removes a limit. "
            "Lowering is refused."
        )
    )


class EventSerializer(serializers.ModelSerializer[LoopEvent]):
    class Meta:
        model = LoopEvent
        fields = ["seq", "type", "from_status", "to_status", "actor", "data", "created_at"]
        read_only_fields = fields


class StepSerializer(serializers.ModelSerializer[LoopStep]):
    class Meta:
        model = LoopStep
        fields = [
            "seq", "role", "invocation", "kind", "status", "name", "idempotency_key", "request",
            "response", "error", "tokens_in", "tokens_out", "cost", "started_at", "finished_at",
            "duration_ms",
        ]  # fmt: skip
        read_only_fields = fields


class ArtifactSerializer(serializers.ModelSerializer[LoopArtifact]):
    class Meta:
        model = LoopArtifact
        fields = ["id", "kind", "name", "content_type", "content", "metadata", "created_at"]
        read_only_fields = fields


class ApprovalSerializer(serializers.ModelSerializer[ActionApproval]):
    pattern = serializers.CharField(source="run.pattern.key", read_only=True)
    goal = serializers.CharField(source="run.goal", read_only=True)

    class Meta:
        model = ActionApproval
        fields = [
            "id", "run", "pattern", "goal", "step_seq", "role", "invocation", "employee_username",
            "tool_name", "arguments", "reason", "status", "policy_version", "proposal_hash",
            "decided_input", "decided_by", "decided_at", "decision_reason", "approved_hash",
            "executed_hash", "executed_at", "expires_at", "created_at",
        ]  # fmt: skip
        read_only_fields = fields


class DecideSerializer(serializers.Serializer[Any]):
    decision = serializers.ChoiceField(choices=["approve", "reject"])
    input = serializers.JSONField(
        required=False, allow_null=True, default=None, help_text="Edited tool arguments."
    )
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)

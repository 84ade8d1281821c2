"""Input and output shapes of the Skill Hub API (rules live in the services)."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from rest_framework import serializers

from orchestrator.strict import StrictModelSerializer, StrictSerializer
from skillhub.models import (
    ExecutionStatus,
    Skill,
    SkillExecution,
    SkillExecutionEvent,
    SkillLanguage,
    SkillLoopConfig,
    SkillOutputFile,
    ToolScope,
)

_SKILL_FIELDS = [
    "tool_name", "title", "description", "instructions", "code_template", "language",
    "input_schema", "interaction_schema", "packages", "timeout_seconds", "max_output_size_mb",
    "enabled", "auto_call", "tool_scope", "employees", "source", "source_ref", "source_path",
    "source_commit", "has_archive", "archive_base64", "agent_tool_name", "created_by",
    "created_at", "updated_at",
]  # fmt: skip


class SkillSerializer(StrictModelSerializer[Skill]):
    tool_name = serializers.CharField(
        max_length=48,
        help_text="Immutable name; agents call the skill as `skill_hub_<tool_name>`.",
    )
    language = serializers.ChoiceField(choices=SkillLanguage.choices)
    input_schema = serializers.JSONField(
        help_text="JSON Schema (2020-12) of the inputs; every {{placeholder}} must be a property."
    )
    interaction_schema = serializers.JSONField(required=False, allow_null=True)
    packages = serializers.ListField(child=serializers.CharField(), required=False)
    employees = serializers.ListField(child=serializers.CharField(), required=False)
    tool_scope = serializers.ChoiceField(choices=ToolScope.choices, required=False)
    archive_base64 = serializers.CharField(
        write_only=True,
        required=False,
        allow_null=True,
        help_text="db-zip source: a zip (base64) whose files are placed in the working directory.",
    )
    has_archive = serializers.SerializerMethodField()
    agent_tool_name = serializers.CharField(read_only=True)

    class Meta:
        model = Skill
        fields = _SKILL_FIELDS
        read_only_fields = ["source_commit", "created_by", "created_at", "updated_at"]

    def get_has_archive(self, skill: Skill) -> bool:
        return bool(skill.archive)

    def validate_archive_base64(self, value: str | None) -> bytes | None:
        if value is None:
            return None
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise serializers.ValidationError("not valid base64") from exc

    def service_fields(self) -> dict[str, Any]:
        data = dict(self.validated_data)
        if "archive_base64" in data:
            data["archive"] = data.pop("archive_base64")
        return data


class SkillUpdateSerializer(SkillSerializer):
    tool_name = serializers.CharField(max_length=48, required=False)
    language = serializers.ChoiceField(choices=SkillLanguage.choices, required=False)
    input_schema = serializers.JSONField(required=False)


class SkillTestSerializer(StrictSerializer):
    inputs = serializers.JSONField(default=dict, help_text="Arguments matching input_schema.")
    wait_seconds = serializers.FloatField(
        default=None,
        allow_null=True,
        min_value=0,
        max_value=660,
        help_text="How long to wait for the result (default: the skill's timeout + 30 s).",
    )


class OutputFileSerializer(StrictModelSerializer[SkillOutputFile]):
    downloadable = serializers.SerializerMethodField()

    class Meta:
        model = SkillOutputFile
        fields = ["name", "size", "downloadable"]

    def get_downloadable(self, f: SkillOutputFile) -> bool:
        return f.data is not None


class ExecutionSerializer(StrictModelSerializer[SkillExecution]):
    status = serializers.ChoiceField(choices=ExecutionStatus.choices, read_only=True)
    output_files = OutputFileSerializer(many=True, read_only=True)

    class Meta:
        model = SkillExecution
        fields = [
            "id", "tool_name", "language", "status", "inputs", "principal", "origin", "run_id",
            "network", "timeout_seconds", "attempts", "exit_code", "timed_out", "killed_reason",
            "stdout", "stderr", "stdout_truncated", "stderr_truncated", "duration_ms", "backend",
            "notes", "error", "output_files", "created_at", "started_at", "finished_at",
        ]  # fmt: skip
        read_only_fields = fields


class ExecutionDetailSerializer(ExecutionSerializer):
    class Meta(ExecutionSerializer.Meta):
        fields = [*ExecutionSerializer.Meta.fields, "code", "packages"]
        read_only_fields = fields


class ExecutionEventSerializer(StrictModelSerializer[SkillExecutionEvent]):
    """One event; ``data`` depends on ``type`` (docs/skills.md, Progress events)."""

    class Meta:
        model = SkillExecutionEvent
        fields = ["seq", "type", "data", "created_at"]
        read_only_fields = fields


class McpToolSerializer(StrictSerializer):
    name = serializers.CharField()
    description = serializers.CharField()
    inputSchema = serializers.JSONField()
    outputSchema = serializers.JSONField(
        help_text="The schema of `structuredContent` of a call that is not an error (the "
        "execution summary)."
    )
    annotations = serializers.JSONField(
        help_text="MCP tool annotations: `readOnlyHint` for a read-effect skill (`auto_call`), "
        "else `destructiveHint`; `openWorldHint` when the caller's sandbox has a network."
    )


class McpCallSerializer(StrictSerializer):
    name = serializers.CharField(help_text="The skill's tool_name (or skill_hub_<tool_name>).")
    arguments = serializers.JSONField(default=dict)


class McpContentSerializer(StrictSerializer):
    content = serializers.ListField(child=serializers.JSONField())
    isError = serializers.BooleanField()
    structuredContent = serializers.JSONField()


class TemplateSerializer(StrictSerializer):
    key = serializers.CharField()
    title = serializers.CharField()
    language = serializers.CharField()
    code_template = serializers.CharField()
    input_schema = serializers.JSONField()


class GitSourceSerializer(StrictSerializer):
    repository = serializers.CharField(
        max_length=1000,
        help_text="An https:// Git URL (schemes and hosts: LOOPWRIGHT_GIT_SCHEMES, _HOSTS).",
    )
    ref = serializers.CharField(max_length=200, required=False, default="HEAD")
    apply = serializers.BooleanField(
        default=False, help_text="gitSyncSkills: false shows the diff only; true applies it."
    )


class LoopConfigSerializer(StrictModelSerializer[SkillLoopConfig]):
    class Meta:
        model = SkillLoopConfig
        fields = ["requires_review", "review_prompt", "review_schema", "updated_at"]
        read_only_fields = ["updated_at"]

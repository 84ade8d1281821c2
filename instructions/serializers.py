"""Input and output shapes of the instructions API (snake_case, like the rest of the API).

A version's text is long (up to 100,000 characters), so lists of versions and instructions carry
the version's facts without it; one version (``versions/{n}``, a saved draft, a publish)
carries its text.
"""

from __future__ import annotations

from rest_framework import serializers

from instructions.models import Instruction, InstructionVersion
from orchestrator.strict import StrictModelSerializer, StrictSerializer

_VERSION_FIELDS = [
    "version", "status", "note", "created_by", "created_at", "updated_at", "published_by",
    "published_at",
]  # fmt: skip


# --- Output -----------------------------------------------------------------------------------


class InstructionVersionSummarySerializer(StrictModelSerializer[InstructionVersion]):
    class Meta:
        model = InstructionVersion
        fields = _VERSION_FIELDS
        read_only_fields = fields


class InstructionVersionSerializer(StrictModelSerializer[InstructionVersion]):
    class Meta:
        model = InstructionVersion
        fields = [*_VERSION_FIELDS, "text"]
        read_only_fields = fields


class InstructionSerializer(StrictModelSerializer[Instruction]):
    current_version = InstructionVersionSummarySerializer(read_only=True, allow_null=True)
    draft_version = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="Number of the open draft, if any."
    )

    class Meta:
        model = Instruction
        fields = [
            "name", "description", "current_version", "draft_version", "created_at", "updated_at",
        ]  # fmt: skip
        read_only_fields = fields


class InstructionDiffSerializer(StrictSerializer):
    from_version = serializers.IntegerField(help_text="The older side (`---` header).")
    to_version = serializers.IntegerField(help_text="The newer side (`+++` header).")
    diff = serializers.CharField(
        help_text="A unified diff headed `name@from` / `name@to`; empty when the texts are equal."
    )


class InstructionUsageSerializer(StrictSerializer):
    kind = serializers.CharField(help_text="What holds the reference: `employee`, `pattern`.")
    # Documents the response key; the metaclass moves fields off the class, so the serializer's
    # own ``label`` attribute is not shadowed at runtime.
    label = serializers.CharField(  # type: ignore[assignment]
        help_text="Its name (an employee's username, a pattern's key)."
    )
    field = serializers.CharField(help_text="The field that holds the reference.")
    url = serializers.CharField(help_text="The API resource of what holds it.")
    pinned_version = serializers.IntegerField(
        allow_null=True, help_text="The version the reference names; null: the latest published."
    )


# --- Input ------------------------------------------------------------------------------------


class InstructionCreateSerializer(StrictSerializer):
    name = serializers.CharField(
        max_length=100,
        help_text="1-100 lower-case letters, digits, '-' or '_', a letter or digit first.",
    )
    description = serializers.CharField(required=False, allow_blank=True, default="")
    text = serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text="Text of version 1, saved as a draft (at most 100,000 characters).",
    )
    note = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")


class InstructionUpdateSerializer(StrictSerializer):
    description = serializers.CharField(allow_blank=True)


class InstructionDraftSerializer(StrictSerializer):
    text = serializers.CharField(
        allow_blank=True, trim_whitespace=False, help_text="At most 100,000 characters."
    )
    note = serializers.CharField(
        required=False, allow_blank=True, max_length=500, help_text="Absent: keep the draft's."
    )


class InstructionPublishSerializer(StrictSerializer):
    version = serializers.IntegerField(
        required=False, min_value=1, help_text="The draft's number, to guard against surprises."
    )

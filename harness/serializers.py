"""Input and output shapes of the harness API. Settings are validated by the services (pydantic).

Resource fields are snake_case like the rest of the API; settings keep their camelCase keys, and
the compile preview answers ``{profile, settings, provenance, layers, toolPlan}``.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from harness.models import HarnessProfile, HarnessProfileVersion
from harness.planner import TRUST_TIERS
from harness.schema import HarnessLayer, HarnessSettings, openapi_schema
from orchestrator.strict import StrictModelSerializer, StrictSerializer
from runtime.policy import Decision
from runtime.types import Effect


@extend_schema_field(openapi_schema(HarnessLayer), component_name="HarnessLayer")
class HarnessLayerField(serializers.JSONField):
    """Layer settings (any JSON here; the services validate it and point at every problem)."""


@extend_schema_field(openapi_schema(HarnessSettings), component_name="HarnessSettings")
class HarnessSettingsField(serializers.JSONField):
    """Compiled, complete settings."""


class StrictInput(StrictSerializer):
    """A request body; as every serializer of the API, it refuses keys it does not know
    (:mod:`orchestrator.strict`)."""


# --- Output -----------------------------------------------------------------------------------


class VersionSerializer(StrictModelSerializer[HarnessProfileVersion]):
    settings = HarnessLayerField(read_only=True)

    class Meta:
        model = HarnessProfileVersion
        fields = [
            "version", "status", "settings", "note", "created_by", "created_at", "updated_at",
            "published_by", "published_at",
        ]  # fmt: skip
        read_only_fields = fields


class ProfileSerializer(StrictModelSerializer[HarnessProfile]):
    current_version = VersionSerializer(read_only=True, allow_null=True)
    draft_version = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="Number of the open draft, if any."
    )

    class Meta:
        model = HarnessProfile
        fields = [
            "tag", "description", "current_version", "draft_version", "created_at", "updated_at",
        ]  # fmt: skip
        read_only_fields = fields


class ProblemItemSerializer(StrictSerializer):
    pointer = serializers.CharField(help_text="JSON Pointer to the offending field.")
    detail = serializers.CharField()
    code = serializers.CharField()


class ValidateResultSerializer(StrictSerializer):
    valid = serializers.BooleanField()
    # Documents the response key; the metaclass moves fields off the class, so the serializer's
    # own ``errors`` property is not shadowed at runtime.
    errors = ProblemItemSerializer(many=True)  # type: ignore[assignment]


class ProfileRefSerializer(StrictSerializer):
    tag = serializers.CharField()
    version = serializers.IntegerField()


class PlannedToolSerializer(StrictSerializer):
    name = serializers.CharField()
    decision = serializers.ChoiceField(choices=[d.value for d in Decision])
    reason = serializers.CharField()
    effect = serializers.ChoiceField(choices=[e.value for e in Effect])
    tier = serializers.ChoiceField(choices=sorted(set(TRUST_TIERS.values())))


class CompileResultSerializer(StrictSerializer):
    profile = ProfileRefSerializer()
    settings = HarnessSettingsField()
    provenance = serializers.DictField(
        child=serializers.CharField(), help_text="Field path → the layer that decided it."
    )
    layers = serializers.ListField(child=serializers.CharField())
    toolPlan = PlannedToolSerializer(many=True)


# --- Input ------------------------------------------------------------------------------------


class ProfileCreateSerializer(StrictInput):
    tag = serializers.SlugField(max_length=100)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    settings = HarnessLayerField(help_text="Settings of version 1 (published at once).")


class ProfileUpdateSerializer(StrictInput):
    description = serializers.CharField(allow_blank=True)


class SaveDraftSerializer(StrictInput):
    settings = HarnessLayerField()
    note = serializers.CharField(required=False, allow_blank=True, max_length=500)


class PublishSerializer(StrictInput):
    version = serializers.IntegerField(
        required=False, min_value=1, help_text="The draft's number, to guard against surprises."
    )


class ValidateSerializer(StrictInput):
    settings = HarnessLayerField()


class EmployeeLayerSerializer(StrictInput):
    username = serializers.CharField(max_length=150, required=False)
    harness_tag = serializers.CharField(
        max_length=120,
        required=False,
        help_text="The employee's own profile ('tag' or 'tag@version'), stacked before its "
        "inline settings.",
    )
    harness = HarnessLayerField(required=False)


class ToolInputSerializer(StrictInput):
    name = serializers.CharField(max_length=128)
    effect = serializers.ChoiceField(choices=[e.value for e in Effect])
    enforceable = serializers.BooleanField(required=False, default=True)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    parameters = serializers.DictField(required=False, default=dict)


class CompileSerializer(StrictInput):
    tag = serializers.CharField(max_length=120, help_text="'tag' or 'tag@version'.")
    pattern = HarnessLayerField(required=False)
    employee = EmployeeLayerSerializer(required=False)
    overrides = HarnessLayerField(required=False)
    tools = ToolInputSerializer(many=True, required=False, default=list)

"""REST endpoints of a skill's version chain and of registry install (docs/skills.md):
``GET /skills/{tool_name}/versions`` (every role), ``POST /skills/{tool_name}/rollback``,
``POST /skills/registry/list`` and ``POST /skills/registry/install`` (operators, admins)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from orchestrator.accounts.actors import request_actor
from orchestrator.accounts.permissions import IsOperator, IsViewer
from orchestrator.strict import StrictSerializer
from skillhub.models import SkillVersion
from skillhub.serializers import SkillSerializer
from skillhub.services.registry import MAX_INSTALL, registry_install, registry_list
from skillhub.services.rollback import skill_rollback
from skillhub.services.skills import skill_get
from skillhub.services.versions import REASON_MAX, versions_list

_PROBLEM = OpenApiResponse(description="application/problem+json")


class SkillVersionSerializer(serializers.ModelSerializer[SkillVersion]):
    class Meta:
        model = SkillVersion
        fields = ["number", "kind", "actor", "reason", "restored_from", "created_at", "state",
                  "archive_sha256"]  # fmt: skip
        read_only_fields = fields


class RollbackSerializer(StrictSerializer):
    version = serializers.IntegerField(
        min_value=1, required=False,
        help_text="The version to restore; default: the one before the current state's.",
    )  # fmt: skip
    reason = serializers.CharField(max_length=REASON_MAX, help_text="Why (kept in the chain).")


class RegistrySourceSerializer(StrictSerializer):
    index_url = serializers.CharField(
        max_length=2000, help_text='An http(s) URL of an index {"skills": [...]}.'
    )


class RegistryInstallSerializer(RegistrySourceSerializer):
    names = serializers.ListField(
        child=serializers.CharField(max_length=48), min_length=1, max_length=MAX_INSTALL
    )


class SkillVersionsView(APIView):
    permission_classes = [IsViewer]

    @extend_schema(
        responses={200: SkillVersionSerializer(many=True), 404: _PROBLEM},
        description="The skill's version chain, newest first: each version is the full state "
        "after a change (create, edit, Git sync, registry install, rollback), who and why.",
    )
    def get(self, request: Request, tool_name: str) -> Response:
        versions = versions_list(skill_get(tool_name=tool_name))
        return Response(SkillVersionSerializer(versions, many=True).data)


class SkillRollbackView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(
        request=RollbackSerializer,
        responses={200: SkillSerializer, 400: _PROBLEM, 404: _PROBLEM},
        description="Restore every field (code, schemas, packages, limits, scope, archive, "
        "source, enabled) of a version, recorded as a new `rollback` version with who and the "
        "required `reason`. Without `version`: the version before the one the current state "
        "came from (repeated rollbacks go further back).",
    )
    def post(self, request: Request, tool_name: str) -> Response:
        body = RollbackSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        skill = skill_rollback(
            skill=skill_get(tool_name=tool_name), actor=request_actor(request),
            reason=body.validated_data["reason"], to=body.validated_data.get("version"),
        )  # fmt: skip
        return Response(SkillSerializer(skill).data)


class RegistryListView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(
        request=RegistrySourceSerializer,
        responses={
            200: OpenApiResponse(description="The index with what is installed"),
            400: _PROBLEM,
        },
        description="Read the registry index (through the outbound guard; nothing is written): "
        "each package with the installed skill of its name and `status` new, update, "
        "unchanged or conflict.",
    )
    def post(self, request: Request) -> Response:
        body = RegistrySourceSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(registry_list(index_url=body.validated_data["index_url"]))


class RegistryInstallView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(
        request=RegistryInstallSerializer,
        responses={
            200: OpenApiResponse(description="What was installed, updated, unchanged"),
            400: _PROBLEM,
        },
        description="Download the named packages, verify each zip's sha256 against the index "
        "and install or update them, all or nothing. Installed and updated skills are disabled "
        "until a person enables them; each change is a version (roll back to undo).",
    )
    def post(self, request: Request) -> Response:
        body = RegistryInstallSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        result = registry_install(
            index_url=data["index_url"], names=data["names"], actor=request_actor(request)
        )
        return Response(result)

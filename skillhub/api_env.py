"""REST endpoints of a skill's package environment (docs/skills.md, "Packages"):
``GET /skills/{tool_name}/env`` (every role), ``POST`` initEnv and ``DELETE`` clearStorage
(operators, admins)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from orchestrator.accounts.permissions import ReadOrOperator
from skillhub.services.environments import (
    environment_clear,
    environment_init,
    environment_status,
)
from skillhub.services.skills import skill_get

_PROBLEM = OpenApiResponse(description="application/problem+json")


class SkillEnvironmentSerializer(serializers.Serializer[dict[str, object]]):
    status = serializers.ChoiceField(
        choices=["none", "missing", "ready", "failed", "cleared"],
        help_text="none: no packages declared; missing: never built; cleared: removed by "
        "clearStorage (the pins stay and are installed again).",
    )
    packages = serializers.ListField(child=serializers.CharField())
    key = serializers.CharField(allow_null=True, help_text="The environment's cache key.")
    pins = serializers.ListField(
        child=serializers.CharField(),
        help_text="Every installed distribution: name==version (pip) or name@version (npm).",
    )
    size_bytes = serializers.IntegerField()
    built_at = serializers.DateTimeField(allow_null=True)
    error = serializers.CharField(allow_blank=True, help_text="Why the last build failed.")
    index_url = serializers.CharField(allow_null=True)
    interpreter = serializers.CharField(allow_null=True)
    on_disk = serializers.BooleanField(help_text="Built in this host's cache now.")
    removed = serializers.BooleanField(required=False, help_text="clearStorage only.")


class SkillEnvironmentView(APIView):
    permission_classes = [ReadOrOperator]

    @extend_schema(
        responses={200: SkillEnvironmentSerializer, 404: _PROBLEM},
        description="The skill's package environment: status, pinned versions, size.",
    )
    def get(self, request: Request, tool_name: str) -> Response:
        status = environment_status(skill=skill_get(tool_name=tool_name))
        return Response(SkillEnvironmentSerializer(status).data)

    @extend_schema(
        request=None,
        responses={200: SkillEnvironmentSerializer, 400: _PROBLEM, 404: _PROBLEM},
        description="initEnv: build the skill's package environment now, or reuse it when "
        "built (pip wheels only / npm without scripts, outside the sandbox; the versions the "
        "first build resolved are installed again on every rebuild). A package that cannot be "
        "installed is a 400 pointing at its `/packages/N`.",
    )
    def post(self, request: Request, tool_name: str) -> Response:
        status = environment_init(skill=skill_get(tool_name=tool_name))
        return Response(SkillEnvironmentSerializer(status).data)

    @extend_schema(
        responses={200: SkillEnvironmentSerializer, 404: _PROBLEM},
        description="clearStorage: delete the skill's package environment from this host's "
        "cache (`removed`: whether one was there). Its pins are kept: the next run or initEnv "
        "rebuilds it with the same versions.",
    )
    def delete(self, request: Request, tool_name: str) -> Response:
        status = environment_clear(skill=skill_get(tool_name=tool_name))
        return Response(SkillEnvironmentSerializer(status).data)

"""REST endpoints for harness profiles: thin views over the services.

``/api/v1/harness-profiles`` lists profiles; a profile is addressed by its tag. Reads are open to
every role and so are ``validate`` and ``compile`` (they change nothing); every write needs an
admin. Draft/publish conflicts are 409 problems.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from harness.models import HarnessProfile
from harness.schema import settings_problems
from harness.selectors import profile_get, profile_list, profile_versions
from harness.serializers import (
    CompileResultSerializer,
    CompileSerializer,
    ProfileCreateSerializer,
    ProfileSerializer,
    ProfileUpdateSerializer,
    PublishSerializer,
    SaveDraftSerializer,
    ValidateResultSerializer,
    ValidateSerializer,
    VersionSerializer,
)
from harness.services import (
    harness_preview,
    profile_create,
    profile_delete,
    profile_publish,
    profile_save_draft,
    profile_update,
)
from orchestrator.accounts.actors import request_actor
from orchestrator.accounts.permissions import IsViewer, ReadOrAdmin
from orchestrator.errors import InvalidInput
from runtime.types import Effect, ToolSpec

#: ``validate`` takes any settings object: reporting what is wrong with it is its answer.
_VALIDATE_REQUEST: dict[str, Any] = {
    "type": "object",
    "properties": {
        "settings": {
            "type": "object",
            "additionalProperties": True,
            "description": "Layer settings to check; every problem is reported in `errors`.",
        }
    },
    "required": ["settings"],
    "additionalProperties": False,
}
_BAD = OpenApiResponse(description="Invalid input (problem+json, every problem in `errors`).")
_MISSING = OpenApiResponse(description="No such profile (problem+json).")
_CONFLICT = OpenApiResponse(description="Draft/publish conflict (problem+json).")


def _body(serializer_class: type[Any], request: Request) -> dict[str, Any]:
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def _tool_spec(data: dict[str, Any]) -> ToolSpec:
    return ToolSpec(
        name=data["name"],
        description=data["description"],
        parameters=data["parameters"],
        effect=Effect(data["effect"]),
        enforceable=data["enforceable"],
    )


#: ``tag`` in a path: the collection's own actions are routed before profiles, so a profile
#: cannot be addressed by their names.
_TAG = OpenApiParameter(
    "tag",
    {
        "type": "string",
        "pattern": r"^[-a-zA-Z0-9_]+$",
        "not": {"enum": ["compile", "create-profile", "validate"]},
    },
    OpenApiParameter.PATH,
    description="The profile's tag.",
)


@extend_schema_view(
    retrieve=extend_schema(parameters=[_TAG]),
    update=extend_schema(parameters=[_TAG]),
    partial_update=extend_schema(parameters=[_TAG]),
    destroy=extend_schema(parameters=[_TAG]),
)
class HarnessProfileViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[HarnessProfile]
):
    """Harness profiles (policy bundles) with draft/publish versioning."""

    serializer_class = ProfileSerializer
    permission_classes = [ReadOrAdmin]
    lookup_field = "tag"
    lookup_value_regex = r"[-a-zA-Z0-9_]+"

    def get_queryset(self) -> Any:
        return profile_list()

    def get_permissions(self) -> Sequence[Any]:
        if self.action in ("validate", "compile"):
            return [IsViewer()]
        return super().get_permissions()

    def _profile_response(self, tag: str, code: int = status.HTTP_200_OK) -> Response:
        return Response(ProfileSerializer(profile_get(tag=tag)).data, status=code)

    @extend_schema(
        request=ProfileCreateSerializer,
        responses={201: ProfileSerializer, 400: _BAD, 409: _CONFLICT},
        description="Same as `create-profile`.",
    )
    def create(self, request: Request) -> Response:
        return self._create(request)

    @extend_schema(
        request=ProfileCreateSerializer,
        responses={201: ProfileSerializer, 400: _BAD, 409: _CONFLICT},
        description="Create a profile and its version 1, published, in one transaction.",
    )
    @action(detail=False, methods=["post"], url_path="create-profile")
    def create_profile(self, request: Request) -> Response:
        return self._create(request)

    def _create(self, request: Request) -> Response:
        body = _body(ProfileCreateSerializer, request)
        profile = profile_create(**body, created_by=request_actor(request))
        return self._profile_response(profile.tag, status.HTTP_201_CREATED)

    @extend_schema(
        request=ProfileUpdateSerializer,
        responses={200: ProfileSerializer, 400: _BAD, 404: _MISSING},
        description="Change the description. Settings change only through save-draft/publish.",
    )
    def update(self, request: Request, tag: str) -> Response:
        body = _body(ProfileUpdateSerializer, request)
        profile = profile_update(tag=tag, description=body["description"])
        return self._profile_response(profile.tag)

    @extend_schema(
        request=ProfileUpdateSerializer,
        responses={200: ProfileSerializer, 400: _BAD, 404: _MISSING},
        description="Change the description. Settings change only through save-draft/publish.",
    )
    def partial_update(self, request: Request, tag: str) -> Response:
        return self.update(request, tag)

    @extend_schema(
        responses={204: None, 404: _MISSING, 409: _CONFLICT},
        description="Delete a profile and its versions (runs keep their snapshots). "
        "The seeded profiles default, safe and file-heavy cannot be deleted (409).",
    )
    def destroy(self, request: Request, tag: str) -> Response:
        profile_delete(tag=tag)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses={200: VersionSerializer(many=True), 404: _MISSING})
    @action(detail=True, methods=["get"])
    def versions(self, request: Request, tag: str) -> Response:
        """Every version of the profile, newest first."""
        queryset = profile_versions(tag=tag)
        paginator = self.paginator
        page = paginator.paginate_queryset(queryset, request, view=self) if paginator else None
        if paginator is None or page is None:
            return Response(VersionSerializer(queryset, many=True).data)
        return paginator.get_paginated_response(VersionSerializer(page, many=True).data)

    @extend_schema(
        request=SaveDraftSerializer,
        responses={200: VersionSerializer, 400: _BAD, 404: _MISSING},
        description="Write into the open draft, or open the next version when none is open.",
    )
    @action(detail=True, methods=["post"], url_path="save-draft")
    def save_draft(self, request: Request, tag: str) -> Response:
        body = _body(SaveDraftSerializer, request)
        version = profile_save_draft(
            tag=tag,
            settings=body["settings"],
            note=body.get("note"),
            created_by=request_actor(request),
        )
        return Response(VersionSerializer(version).data)

    @extend_schema(
        request=PublishSerializer,
        responses={200: VersionSerializer, 404: _MISSING, 409: _CONFLICT},
        description="Publish the open draft and make it current. 409 when there is no open "
        "draft or `version` is not the open draft.",
    )
    @action(detail=True, methods=["post"])
    def publish(self, request: Request, tag: str) -> Response:
        body = _body(PublishSerializer, request)
        version = profile_publish(
            tag=tag, version=body.get("version"), published_by=request_actor(request)
        )
        return Response(VersionSerializer(version).data)

    @extend_schema(
        request={"application/json": _VALIDATE_REQUEST},
        responses={200: ValidateResultSerializer, 400: _BAD},
        description="Check settings against the schema and report every problem (200 either way; "
        "400 only when `settings` is not an object).",
    )
    @action(detail=False, methods=["post"])
    def validate(self, request: Request) -> Response:
        body = _body(ValidateSerializer, request)
        if not isinstance(body["settings"], dict):
            raise InvalidInput(
                "settings must be a JSON object.",
                errors=[{"pointer": "/settings", "detail": "Must be an object.", "code": "type"}],
            )
        problems = settings_problems(body["settings"], ("settings",))
        return Response({"valid": not problems, "errors": problems})

    @extend_schema(
        request=CompileSerializer,
        responses={200: CompileResultSerializer, 400: _BAD},
        description="Preview what a role would run under: the compiled settings, which layer "
        "decided each field, and the tool plan for the given tools.",
    )
    @action(detail=False, methods=["post"])
    def compile(self, request: Request) -> Response:
        body = _body(CompileSerializer, request)
        employee = body.get("employee") or {}
        compilation, plan = harness_preview(
            tag=body["tag"],
            pattern_layer=body.get("pattern"),
            employee_username=employee.get("username"),
            employee_profile=employee.get("harness_tag") or None,
            employee_layer=employee.get("harness"),
            run_overrides=body.get("overrides"),
            tools=[_tool_spec(tool) for tool in body["tools"]],
        )
        return Response({**compilation.snapshot(), "toolPlan": plan.as_list()})

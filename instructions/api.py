"""REST endpoints for instructions: thin views over the services.

``/api/v1/instructions`` lists instructions; one is addressed by its name. Reads are open to
every role; every write needs an admin. Draft/publish conflicts and deleting an instruction
still in use are 409 problems.
"""

from __future__ import annotations

from dataclasses import asdict
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

from instructions.models import Instruction
from instructions.selectors import (
    instruction_get,
    instruction_list,
    instruction_version_get,
    instruction_versions,
)
from instructions.serializers import (
    InstructionCreateSerializer,
    InstructionDiffSerializer,
    InstructionDraftSerializer,
    InstructionPublishSerializer,
    InstructionSerializer,
    InstructionUpdateSerializer,
    InstructionUsageSerializer,
    InstructionVersionSerializer,
    InstructionVersionSummarySerializer,
)
from instructions.services import (
    instruction_create,
    instruction_delete,
    instruction_diff,
    instruction_publish,
    instruction_save_draft,
    instruction_update,
)
from instructions.usage import instruction_usages
from orchestrator.accounts.actors import request_actor
from orchestrator.accounts.permissions import ReadOrAdmin
from orchestrator.errors import InvalidInput

_BAD = OpenApiResponse(description="Invalid input (problem+json, every problem in `errors`).")
_MISSING = OpenApiResponse(description="No such instruction or version (problem+json).")
_CONFLICT = OpenApiResponse(description="Draft/publish conflict (problem+json).")
_NAME_PATTERN = r"[a-z0-9][a-z0-9_-]{0,99}"
_NAME = OpenApiParameter(
    "name",
    {"type": "string", "pattern": f"^{_NAME_PATTERN}$"},
    OpenApiParameter.PATH,
    description="The instruction's name.",
)
_VERSION = OpenApiParameter(
    "version", int, OpenApiParameter.PATH, description="The version's number (1 or more)."
)
_FROM = OpenApiParameter(
    "from", int, OpenApiParameter.QUERY, required=True, description="The older version."
)
_TO = OpenApiParameter(
    "to", int, OpenApiParameter.QUERY, required=True, description="The newer version."
)


def _body(serializer_class: type[Any], request: Request) -> dict[str, Any]:
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def _version_param(request: Request, key: str) -> int:
    raw = request.query_params.get(key, "")
    if not raw.isdigit() or len(raw) > 9 or int(raw) < 1:
        detail = f"`{key}` must be a version number (1 or more)."
        problem = {"pointer": f"/{key}", "detail": detail, "code": "invalid"}
        raise InvalidInput(detail, errors=[problem])
    return int(raw)


@extend_schema_view(
    retrieve=extend_schema(
        parameters=[_NAME], description="One instruction, with its current version's facts."
    ),
    list=extend_schema(description="Every instruction, by name."),
)
class InstructionViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[Instruction]
):
    """Named prompt instructions with draft/publish versioning."""

    serializer_class = InstructionSerializer
    permission_classes = [ReadOrAdmin]
    lookup_field = "name"
    lookup_value_regex = _NAME_PATTERN

    def get_queryset(self) -> Any:
        return instruction_list()

    def _instruction_response(self, name: str, code: int = status.HTTP_200_OK) -> Response:
        return Response(InstructionSerializer(instruction_get(name=name)).data, status=code)

    @extend_schema(
        request=InstructionCreateSerializer,
        responses={201: InstructionSerializer, 400: _BAD, 409: _CONFLICT},
        description="Create an instruction; with `text`, its version 1 as a draft. Nothing is "
        "published: references resolve after the first publish.",
    )
    def create(self, request: Request) -> Response:
        body = _body(InstructionCreateSerializer, request)
        instruction = instruction_create(**body, created_by=request_actor(request))
        return self._instruction_response(instruction.name, status.HTTP_201_CREATED)

    @extend_schema(
        parameters=[_NAME],
        request=InstructionUpdateSerializer,
        responses={200: InstructionSerializer, 400: _BAD, 404: _MISSING},
        description="Change the description. The text changes only through draft/publish.",
    )
    def partial_update(self, request: Request, name: str) -> Response:
        body = _body(InstructionUpdateSerializer, request)
        instruction = instruction_update(name=name, description=body["description"])
        return self._instruction_response(instruction.name)

    @extend_schema(
        parameters=[_NAME],
        responses={204: None, 404: _MISSING, 409: _CONFLICT},
        description="Delete an instruction and its versions. Refused (409, naming each use) "
        "while an employee's system prompt or a pattern references it.",
    )
    def destroy(self, request: Request, name: str) -> Response:
        instruction_delete(name=name)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        parameters=[_NAME],
        responses={200: InstructionVersionSummarySerializer(many=True), 404: _MISSING},
        description="Every version of the instruction, newest first, without their text.",
    )
    @action(detail=True, methods=["get"])
    def versions(self, request: Request, name: str) -> Response:
        queryset = instruction_versions(name=name)
        paginator = self.paginator
        page = paginator.paginate_queryset(queryset, request, view=self) if paginator else None
        if paginator is None or page is None:
            return Response(InstructionVersionSummarySerializer(queryset, many=True).data)
        data = InstructionVersionSummarySerializer(page, many=True).data
        return paginator.get_paginated_response(data)

    @extend_schema(
        parameters=[_NAME, _VERSION],
        responses={200: InstructionVersionSerializer, 404: _MISSING},
        description="One version (draft or published) with its text.",
    )
    @action(
        detail=True,
        methods=["get"],
        url_path=r"versions/(?P<version>[0-9]{1,9})",
        url_name="version",
    )
    def version_detail(self, request: Request, name: str, version: str) -> Response:
        found = instruction_version_get(name=name, version=int(version))
        return Response(InstructionVersionSerializer(found).data)

    @extend_schema(
        parameters=[_NAME],
        request=InstructionDraftSerializer,
        responses={200: InstructionVersionSerializer, 400: _BAD, 404: _MISSING},
        description="Write the text into the open draft, or open the next version as a draft "
        "when none is open. A published version never changes.",
    )
    @action(detail=True, methods=["put"])
    def draft(self, request: Request, name: str) -> Response:
        body = _body(InstructionDraftSerializer, request)
        version = instruction_save_draft(
            name=name, text=body["text"], note=body.get("note"), created_by=request_actor(request)
        )
        return Response(InstructionVersionSerializer(version).data)

    @extend_schema(
        parameters=[_NAME],
        request=InstructionPublishSerializer,
        responses={200: InstructionVersionSerializer, 404: _MISSING, 409: _CONFLICT},
        description="Publish the open draft and make it current. 409 when there is no open "
        "draft or `version` is not the open draft.",
    )
    @action(detail=True, methods=["post"])
    def publish(self, request: Request, name: str) -> Response:
        body = _body(InstructionPublishSerializer, request)
        version = instruction_publish(
            name=name, version=body.get("version"), published_by=request_actor(request)
        )
        return Response(InstructionVersionSerializer(version).data)

    @extend_schema(
        parameters=[_NAME, _FROM, _TO],
        responses={200: InstructionDiffSerializer, 400: _BAD, 404: _MISSING},
        description="A unified diff of two versions' texts (drafts included).",
    )
    @action(detail=True, methods=["get"])
    def diff(self, request: Request, name: str) -> Response:
        old, new = _version_param(request, "from"), _version_param(request, "to")
        text = instruction_diff(name, old, new)
        return Response({"from_version": old, "to_version": new, "diff": text})

    @extend_schema(
        parameters=[_NAME],
        responses={200: InstructionUsageSerializer(many=True), 404: _MISSING},
        description="Where the instruction is referenced: employees' system prompts and "
        "patterns' goal templates, each with the version it pins (null: the latest).",
    )
    @action(detail=True, methods=["get"], pagination_class=None)
    def usage(self, request: Request, name: str) -> Response:
        instruction_get(name=name)
        return Response([asdict(u) for u in instruction_usages(name)])

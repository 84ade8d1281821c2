"""``/api/v1/skills/snapshot``: export every skill (or some) as one zip, and import one
(docs/skills.md, Snapshots). Operators only: a snapshot holds every skill's program and files."""

from __future__ import annotations

from typing import IO, Any

from django.http import HttpResponse
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import BaseParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from orchestrator.accounts.actors import request_actor
from orchestrator.accounts.permissions import IsOperator
from orchestrator.parsers import read_bounded
from orchestrator.strict import StrictSerializer
from skillhub.services.snapshot_format import FORMAT_VERSION, SNAPSHOT_MAX_BYTES
from skillhub.services.snapshots import snapshot_export, snapshot_import

_PROBLEM = OpenApiResponse(description="application/problem+json")
_ZIP = "application/zip"
_TRUE, _FALSE = {"true", "1"}, {"false", "0", ""}


class ZipParser(BaseParser):
    """The snapshot as the raw body (``application/zip``), bounded like every body."""

    media_type = _ZIP

    def parse(
        self, stream: IO[bytes] | None, media_type: str | None = None, parser_context: Any = None
    ) -> Any:
        return read_bounded(stream)


class OctetStreamParser(ZipParser):
    media_type = "application/octet-stream"


class SnapshotUploadSerializer(StrictSerializer):
    file = serializers.FileField(allow_empty_file=False, help_text="The snapshot zip.")


class ImportReportSerializer(StrictSerializer):
    format_version = serializers.IntegerField()
    dry_run = serializers.BooleanField()
    replace = serializers.BooleanField()
    manifest_sha256 = serializers.CharField()
    created = serializers.ListField(child=serializers.CharField())
    updated = serializers.ListField(
        child=serializers.JSONField(), help_text="`{tool_name, fields}`: the fields that change."
    )
    unchanged = serializers.ListField(child=serializers.CharField())


def _flag(request: Request, name: str) -> bool:
    value = str(request.query_params.get(name, "")).strip().lower()
    if value not in _TRUE | _FALSE:
        raise ValidationError({name: ["Must be true or false."]})
    return value in _TRUE


def _upload(request: Request) -> bytes:
    if request.content_type.startswith("multipart/"):
        body = SnapshotUploadSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return bytes(body.validated_data["file"].read(SNAPSHOT_MAX_BYTES + 1))
    data = request.data
    if not isinstance(data, bytes) or not data:
        raise ValidationError({"file": ["Send the snapshot zip as the body or as `file`."]})
    return data


_FLAGS = [
    OpenApiParameter(
        "dry_run", bool, description="true: check and report everything, write nothing."
    ),
    OpenApiParameter(
        "replace",
        bool,
        description="true: overwrite local skills of the same name that differ (else 409).",
    ),
]


class SkillSnapshotView(APIView):
    """Skill Hub snapshots: one zip of skills with a checksummed manifest."""

    permission_classes = [IsOperator]
    parser_classes = [ZipParser, OctetStreamParser, MultiPartParser]

    @extend_schema(
        operation_id="skills_snapshot_export",
        parameters=[
            OpenApiParameter(
                "tool_name",
                str,
                many=True,
                description="Export only these skills (repeatable); default: every skill.",
            )
        ],
        responses={
            (200, _ZIP): OpenApiResponse(OpenApiTypes.BINARY, description="The snapshot zip"),
            404: _PROBLEM,
        },
        description=(
            "Every skill (or those named) as one zip: `manifest.json` (format version "
            f"{FORMAT_VERSION}, created at, the instance's version, per skill every field, its "
            "review settings and its files with their SHA-256), `manifest.json.sha256`, and "
            "`skills/<tool_name>/archive.zip`, each skill's own zip byte for byte. The "
            "`X-Manifest-SHA256` header and the file name carry the manifest's SHA-256. "
            "Operators and admins."
        ),
    )
    def get(self, request: Request) -> HttpResponse:
        export = snapshot_export(tool_names=request.query_params.getlist("tool_name") or None)
        response = HttpResponse(export.data, content_type=_ZIP)
        response["Content-Disposition"] = f'attachment; filename="{export.filename}"'
        response["X-Manifest-SHA256"] = export.manifest_sha256
        response["X-Content-Type-Options"] = "nosniff"
        return response

    @extend_schema(
        operation_id="skills_snapshot_import",
        parameters=_FLAGS,
        request={
            _ZIP: {"type": "string", "format": "binary"},
            "application/octet-stream": {"type": "string", "format": "binary"},
            "multipart/form-data": SnapshotUploadSerializer,
        },
        responses={200: ImportReportSerializer, 400: _PROBLEM, 409: _PROBLEM, 413: _PROBLEM},
        description=(
            "Import a snapshot (the raw zip body, or multipart `file`). Every size and "
            "checksum is checked first: a changed byte, a missing or unexpected entry, a "
            "symlink, an unknown format version or an invalid skill is a 400 naming it, and "
            "nothing is written. A local skill of the same name that differs is a 409 unless "
            "`replace=true`, which makes it exactly the snapshot's skill (review settings "
            "included); identical skills are `unchanged`; skills missing from the snapshot are "
            "kept. Every skill goes through the same validation as `POST /skills`, all in one "
            "transaction. The body is bounded by LOOPWRIGHT_MAX_BODY_BYTES (413); larger "
            "snapshots: `manage.py skills_snapshot import`."
        ),
    )
    def post(self, request: Request) -> Response:
        report = snapshot_import(
            data=_upload(request),
            actor=request_actor(request),
            replace=_flag(request, "replace"),
            dry_run=_flag(request, "dry_run"),
        )
        return Response(report.as_dict())


urlpatterns = [path("skills/snapshot", SkillSnapshotView.as_view(), name="skill-snapshot")]

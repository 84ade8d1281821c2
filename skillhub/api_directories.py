"""REST endpoints of skills directories: ``/api/v1/skill-directories[/{key}[/sync]]``
(docs/skill-directories.md). Every role reads; operators (and admins) write and sync."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import (
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
)
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from orchestrator.accounts.permissions import IsOperator, ReadOrOperator
from orchestrator.strict import StrictModelSerializer
from skillhub.models import DIRECTORY_KEY, DirectorySkill, DirectorySource, SkillDirectory
from skillhub.services.directories import (
    MAX_DIRECTORY_SKILLS,
    MAX_LISTED,
    MAX_SKILL_MD_BYTES,
    skill_directory_create,
    skill_directory_delete,
    skill_directory_sync,
    skill_directory_update,
)

_PROBLEM = OpenApiResponse(description="application/problem+json")


@extend_schema_field({"type": "string", "pattern": "^(folder|git)$"})
class DirectorySourceField(serializers.ChoiceField):
    """The source choice, as a pattern in the schema: an enum would collide with the one of
    ``Skill.source`` (the schema names enums after their field)."""


class DirectorySkillSerializer(serializers.ModelSerializer[DirectorySkill]):
    class Meta:
        model = DirectorySkill
        fields = ["name", "description", "source_path", "sha256"]


class SkillDirectorySerializer(StrictModelSerializer[SkillDirectory]):
    key = serializers.RegexField(
        DIRECTORY_KEY, max_length=100,
        help_text=f"Lower-case words joined by - or _ ({DIRECTORY_KEY}); never changes.",
    )  # fmt: skip
    source = DirectorySourceField(  # type: ignore[assignment]  # a field named source
        choices=DirectorySource.choices,
        help_text="`folder`: a folder under LOOPWRIGHT_SKILLS_ROOT; `git`: a folder of a "
        "repository, cloned through the outbound guard.",
    )
    employees = serializers.ListField(
        child=serializers.CharField(max_length=150), required=False, max_length=MAX_LISTED,
        help_text="Usernames of the AI employees that may use the directory; empty: nobody.",
    )  # fmt: skip
    skills = serializers.ListField(
        child=serializers.CharField(max_length=64), required=False, max_length=MAX_LISTED,
        help_text="Names of the skills offered; empty: every skill of the directory.",
    )  # fmt: skip
    catalogue = DirectorySkillSerializer(
        source="entries", many=True, read_only=True, help_text="The skills the last sync read."
    )

    class Meta:
        model = SkillDirectory
        fields = [
            "key", "description", "source", "path", "repository", "ref", "employees", "skills",
            "commit", "synced_at", "catalogue", "created_at", "updated_at",
        ]  # fmt: skip
        read_only_fields = ["commit", "synced_at", "created_at", "updated_at"]
        extra_kwargs = {
            "path": {"help_text": "folder: the folder under LOOPWRIGHT_SKILLS_ROOT; git: the "
                     "folder of the repository (empty: its root). No `..`."},
            "repository": {"help_text": "git: the repository's URL (LOOPWRIGHT_GIT_SCHEMES, "
                           "LOOPWRIGHT_GIT_HOSTS)."},
            "ref": {"help_text": "git: a branch, tag or commit (default HEAD)."},
        }  # fmt: skip


class SkillDirectoryUpdateSerializer(SkillDirectorySerializer):
    key = serializers.RegexField(DIRECTORY_KEY, max_length=100, required=False)
    source = DirectorySourceField(choices=DirectorySource.choices, required=False)


class DirectorySyncedSerializer(serializers.Serializer[Any]):
    key = serializers.CharField()
    commit = serializers.CharField(help_text="The commit a Git sync read; empty for a folder.")
    added = serializers.ListField(child=serializers.CharField())
    updated = serializers.ListField(child=serializers.CharField())
    removed = serializers.ListField(child=serializers.CharField())
    unchanged = serializers.IntegerField()
    refused = serializers.ListField(
        child=serializers.DictField(child=serializers.CharField()),
        help_text="`{path, detail}` of each SKILL.md that was not used, and why.",
    )


@extend_schema_view(
    list=extend_schema(summary="List skills directories"),
    retrieve=extend_schema(summary="Get a skills directory and its synced catalogue"),
    create=extend_schema(
        summary="Create a skills directory",
        description="Nothing is read until the directory is synced. `employees` must be AI "
        "employees; a directory lists nobody by default.",
        responses={201: SkillDirectorySerializer, 400: _PROBLEM, 403: _PROBLEM},
    ),
    partial_update=extend_schema(
        summary="Change a skills directory",
        description="The key never changes; a new source takes effect at the next sync.",
        responses={200: SkillDirectorySerializer, 400: _PROBLEM, 403: _PROBLEM},
    ),
    destroy=extend_schema(summary="Delete a skills directory and its catalogue"),
)
class SkillDirectoryViewSet(viewsets.ModelViewSet[SkillDirectory]):
    """Skills directories (`*/SKILL.md`) whose catalogue the employees they list see in their
    system prompt and load with the `skill` tool."""

    permission_classes = [ReadOrOperator]
    lookup_field = "key"
    lookup_value_regex = DIRECTORY_KEY.strip("^$")
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self) -> QuerySet[SkillDirectory]:
        return SkillDirectory.objects.prefetch_related("entries")

    def get_serializer_class(self) -> type[SkillDirectorySerializer]:
        if self.action == "partial_update":
            return SkillDirectoryUpdateSerializer
        return SkillDirectorySerializer

    def perform_create(self, serializer: serializers.BaseSerializer[SkillDirectory]) -> None:
        serializer.instance = skill_directory_create(**serializer.validated_data)

    def perform_update(self, serializer: serializers.BaseSerializer[SkillDirectory]) -> None:
        assert serializer.instance is not None
        serializer.instance = skill_directory_update(
            directory=serializer.instance, **serializer.validated_data
        )

    def perform_destroy(self, instance: SkillDirectory) -> None:
        skill_directory_delete(directory=instance)

    @extend_schema(
        summary="Sync a skills directory",
        description="Read every `*/SKILL.md` of the folder (or of the repository's folder at "
        "`ref`) and replace the catalogue in one transaction. Front matter `name` and "
        "`description` are required; the Markdown body is the instructions. A SKILL.md that "
        f"cannot be used (no front matter, no name or description, over "
        f"{MAX_SKILL_MD_BYTES // 1024} KB, a link out, a duplicate name) is listed in "
        f"`refused` with the reason; at most {MAX_DIRECTORY_SKILLS} skills. A refused or "
        "failing clone is a 400 `git-import-error` problem.",
        request=None,
        responses={200: DirectorySyncedSerializer, 400: _PROBLEM, 403: _PROBLEM, 404: _PROBLEM},
    )
    @action(detail=True, methods=["post"], permission_classes=[IsOperator], filter_backends=[])
    def sync(self, request: Request, key: str) -> Response:
        report = skill_directory_sync(directory=self.get_object())
        return Response(DirectorySyncedSerializer(report).data)

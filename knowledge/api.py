"""REST API: ``/api/v1/knowledge-bases[/{key}]`` with their ``documents``, ``sync``,
``search`` and ``access``, and ``/api/v1/retrievals`` (docs/knowledge.md).

Every role reads and may make a test search (recorded as a retrieval with no employee and the
caller as user); operators (and admins) change bases, documents and the access matrix. Writes
go through :mod:`knowledge.services` and :mod:`knowledge.services_bases`.
"""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import Count, QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from knowledge import services, services_bases, sync
from knowledge.models import BASE_KEY, KnowledgeBase, Retrieval, RetrievalTool
from knowledge.serializers import (
    DocumentJsonSerializer,
    DocumentStoredSerializer,
    DocumentUploadSerializer,
    FolderSyncedSerializer,
    FolderSyncSerializer,
    GitSyncSerializer,
    KnowledgeAccessSerializer,
    KnowledgeBaseSerializer,
    KnowledgeDocumentSerializer,
    KnowledgeSearchSerializer,
    RetrievalSerializer,
    SearchOutcomeSerializer,
)
from orchestrator.accounts.actors import request_actor
from orchestrator.accounts.permissions import IsViewer, ReadOrOperator
from orchestrator.parsers import BoundedJSONParser


@extend_schema_view(
    list=extend_schema(summary="List knowledge bases"),
    retrieve=extend_schema(summary="Get a knowledge base"),
    create=extend_schema(summary="Create a knowledge base"),
    update=extend_schema(summary="Replace a knowledge base's settings"),
    partial_update=extend_schema(
        summary="Change a knowledge base's settings",
        description="A new embedding model (URL, model or dims) queues re-embedding.",
    ),
    destroy=extend_schema(summary="Delete a knowledge base, its documents and access"),
)
class KnowledgeBaseViewSet(viewsets.ModelViewSet[KnowledgeBase]):
    """Knowledge bases AI employees search with knowledge_search / external_rag_search, as the
    access matrix allows."""

    serializer_class = KnowledgeBaseSerializer
    permission_classes = [ReadOrOperator]
    lookup_field = "key"
    lookup_value_regex = BASE_KEY.strip("^$")
    filterset_fields = ["kind", "provider"]
    http_method_names = ["get", "post", "put", "patch", "delete", "head", "options"]

    def get_queryset(self) -> QuerySet[KnowledgeBase]:
        return KnowledgeBase.objects.annotate(document_count=Count("documents"))

    def perform_create(self, serializer: serializers.BaseSerializer[KnowledgeBase]) -> None:
        serializer.instance = services_bases.base_create(**serializer.validated_data)

    def perform_update(self, serializer: serializers.BaseSerializer[KnowledgeBase]) -> None:
        assert serializer.instance is not None
        serializer.instance = services_bases.base_update(
            base=serializer.instance, **serializer.validated_data
        )

    def perform_destroy(self, instance: KnowledgeBase) -> None:
        services_bases.base_delete(base=instance)

    @extend_schema(
        methods=["GET"], summary="List a knowledge base's documents",
        responses=KnowledgeDocumentSerializer(many=True), filters=False,
    )  # fmt: skip
    @extend_schema(
        methods=["POST"],
        summary="Upload a document (multipart file, or JSON name and content)",
        description="Plain text, Markdown or HTML (PDF is refused, 415). A document of the same "
        "name is replaced in one transaction; the same bytes again change nothing. Over "
        "LOOPWRIGHT_KNOWLEDGE_MAX_DOCUMENT_BYTES: 413.",
        request={
            "application/json": DocumentJsonSerializer,
            "multipart/form-data": DocumentUploadSerializer,
        },
        responses={200: DocumentStoredSerializer, 201: DocumentStoredSerializer},
    )
    @action(
        detail=True, methods=["get", "post"], filter_backends=[],
        parser_classes=[BoundedJSONParser, MultiPartParser],
    )  # fmt: skip
    def documents(self, request: Request, key: str) -> Response:
        base = self.get_object()
        if request.method == "GET":
            rows = base.documents.annotate(chunk_count=Count("chunks")).order_by("name")
            paginator = self.paginator
            assert paginator is not None
            page = paginator.paginate_queryset(rows, request, view=self)
            return paginator.get_paginated_response(
                KnowledgeDocumentSerializer(page, many=True).data
            )
        stored = services.document_put(base=base, **self._document_body(request))
        code = status.HTTP_201_CREATED if stored.changed else status.HTTP_200_OK
        return Response(DocumentStoredSerializer(stored).data, status=code)

    @staticmethod
    def _document_body(request: Request) -> dict[str, Any]:
        if request.content_type.startswith("multipart/"):
            upload = DocumentUploadSerializer(data=request.data)
            upload.is_valid(raise_exception=True)
            file = upload.validated_data["file"]
            limit = services.max_document_bytes()
            name = upload.validated_data["name"] or str(file.name or "")
            raw = file.read(limit + 1)
            if len(raw) > limit:
                raise services.DocumentTooLarge(name, limit)
            declared = upload.validated_data["content_type"] or getattr(file, "content_type", "")
            return {"name": name, "raw": raw, "content_type": declared}
        body = DocumentJsonSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        raw = data["content"].encode("utf-8")
        return {"name": data["name"], "raw": raw, "content_type": data["content_type"]}

    @extend_schema(
        summary="Delete a document",
        parameters=[OpenApiParameter("document_id", int, OpenApiParameter.PATH)],
        request=None, responses={204: None},
    )  # fmt: skip
    @action(
        detail=True, methods=["delete"], url_path=r"documents/(?P<document_id>[0-9]+)",
        filter_backends=[],
    )  # fmt: skip
    def delete_document(self, request: Request, key: str, document_id: str) -> Response:
        services.document_delete(services.document_get(self.get_object(), int(document_id)))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        summary="Sync a server folder into the base",
        description="Every .txt, .md, .html and .pdf file under the folder (which must be under "
        "LOOPWRIGHT_KNOWLEDGE_ROOT) becomes a document named by its path in the folder; "
        "documents an earlier sync of the folder made whose files are gone are deleted.",
        request=FolderSyncSerializer, responses=FolderSyncedSerializer,
    )  # fmt: skip
    @action(detail=True, methods=["post"], filter_backends=[])
    def sync(self, request: Request, key: str) -> Response:
        base = self.get_object()
        body = FolderSyncSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        report = sync.folder_sync(base=base, path=body.validated_data["path"])
        return Response(FolderSyncedSerializer(report).data)

    @extend_schema(
        summary="Sync a folder of a Git repository into the base",
        description="The repository is cloned at `ref` through the outbound guard (the same "
        "rules as Skill Hub's Git import); every supported file under `path` becomes a "
        "document named by its path there, with source `git:<repository>#<path>`; documents an "
        "earlier sync of the same repository path made whose files are gone are deleted. A "
        "refused or failing clone is a 400 `git-import-error` problem.",
        request=GitSyncSerializer, responses=FolderSyncedSerializer,
    )  # fmt: skip
    @action(detail=True, methods=["post"], url_path="git-sync", filter_backends=[])
    def git_sync(self, request: Request, key: str) -> Response:
        base = self.get_object()
        body = GitSyncSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        report = sync.git_sync(base=base, **body.validated_data)
        return Response(FolderSyncedSerializer(report).data)

    @extend_schema(
        summary="Search the base (a person's test search)",
        description="Recorded as a retrieval with no employee and you as user. A provider "
        "that fails answers 502.",
        request=KnowledgeSearchSerializer, responses=SearchOutcomeSerializer,
    )  # fmt: skip
    @action(
        detail=True, methods=["post"], permission_classes=[IsViewer],
        filter_backends=[],
    )  # fmt: skip
    def search(self, request: Request, key: str) -> Response:
        base = self.get_object()
        body = KnowledgeSearchSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        outcome = services_bases.knowledge_base_test_search(
            base=base,
            query=body.validated_data["query"],
            top_k=body.validated_data["top_k"],
            user=request_actor(request),
        )
        return Response(SearchOutcomeSerializer(outcome).data)

    @extend_schema(methods=["GET"], summary="The employees that may read the base",
                   responses=KnowledgeAccessSerializer, filters=False)  # fmt: skip
    @extend_schema(
        methods=["PUT"], summary="Set the employees that may read the base",
        description="Replaces the base's row of the knowledge access matrix; every name must "
        "be an AI employee.",
        request=KnowledgeAccessSerializer, responses=KnowledgeAccessSerializer,
    )  # fmt: skip
    @action(detail=True, methods=["get", "put"], filter_backends=[])
    def access(self, request: Request, key: str) -> Response:
        base = self.get_object()
        if request.method == "GET":
            return Response({"employees": services_bases.access_list(base)})
        body = KnowledgeAccessSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        employees = services_bases.access_set(
            base=base, employees=body.validated_data["employees"], by=request_actor(request)
        )
        return Response({"employees": employees})


class RetrievalFilter(django_filters.FilterSet):
    run = django_filters.UUIDFilter(field_name="run_id", help_text="Only this run's searches.")
    employee = django_filters.CharFilter(max_length=150)
    user = django_filters.CharFilter(max_length=150)
    tool = django_filters.ChoiceFilter(choices=RetrievalTool.choices)
    chat = django_filters.BooleanFilter()

    class Meta:
        model = Retrieval
        fields = ["run", "employee", "user", "tool", "chat"]


@extend_schema_view(
    list=extend_schema(summary="List retrievals (knowledge searches made)",
                       description="Newest first; filter by run, employee, user, tool, chat."),
    retrieve=extend_schema(summary="Get a retrieval"),
)  # fmt: skip
class RetrievalViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[Retrieval]
):
    """Every knowledge search an employee's tool or a person made: query, bases, hits with
    scores and sources, latency, and why it was refused or failed."""

    serializer_class = RetrievalSerializer
    filterset_class = RetrievalFilter

    def get_queryset(self) -> QuerySet[Retrieval]:
        return Retrieval.objects.order_by("-created_at", "id")

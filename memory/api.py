"""REST API: ``/api/v1/memories[/{id}]`` and ``GET /api/v1/memories/{id}/uses``.

Every role reads; operators (and admins) create, edit (content and tags) and delete. Writes go
through :mod:`memory.services`, as the Memory Inspector's and the tools' do.
"""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from memory import services
from memory.models import MemoryItem, MemoryItemScope
from memory.serializers import MemoryItemEditSerializer, MemoryItemSerializer, MemoryUseSerializer
from orchestrator.accounts.actors import request_actor
from orchestrator.accounts.permissions import ReadOrOperator


class MemoryFilter(django_filters.FilterSet):
    scope = django_filters.ChoiceFilter(choices=MemoryItemScope.choices)
    username = django_filters.CharFilter(max_length=150)
    employee = django_filters.CharFilter(max_length=150)
    q = django_filters.CharFilter(
        method="search",
        max_length=2000,
        help_text="Words that must all appear in the content or a tag (case-insensitive).",
    )

    class Meta:
        model = MemoryItem
        fields = ["scope", "username", "employee", "q"]

    def search(self, queryset: QuerySet[MemoryItem], name: str, value: str) -> Any:
        return services.with_every_term(queryset, value)


@extend_schema_view(
    list=extend_schema(
        summary="List memory items",
        description="Newest first; filter by scope, person, employee and words (q).",
    ),
    retrieve=extend_schema(summary="Get a memory item"),
    create=extend_schema(
        summary="Save a memory item",
        description="public items name nobody; user items name the person (username); "
        "agent_user items name the person and the AI employee. A 'saved' use is recorded.",
    ),
    partial_update=extend_schema(
        summary="Edit a memory item's content or tags",
        description="Only content and tags change; any other field is refused. An 'edited' "
        "use is recorded.",
        request=MemoryItemEditSerializer,
        responses=MemoryItemSerializer,
    ),
    destroy=extend_schema(
        summary="Delete a memory item",
        description="The item and its uses are removed; no later prompt is given it.",
    ),
)
class MemoryItemViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet[MemoryItem],
):
    """Agent memory: what runs and chats are given in their <agent_memory_context> block and
    find with memory_search (docs/memory.md)."""

    serializer_class = MemoryItemSerializer
    permission_classes = [ReadOrOperator]
    filterset_class = MemoryFilter
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self) -> QuerySet[MemoryItem]:
        return MemoryItem.objects.all()

    def get_serializer_class(self) -> Any:
        if self.action == "partial_update":
            return MemoryItemEditSerializer
        return super().get_serializer_class()

    def perform_create(self, serializer: serializers.BaseSerializer[MemoryItem]) -> None:
        serializer.instance = services.memory_create(
            **serializer.validated_data, created_by=request_actor(self.request)
        )

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        item = self.get_object()
        body = MemoryItemEditSerializer(item, data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        updated = services.memory_update(item, actor=request_actor(request), **body.validated_data)
        return Response(MemoryItemSerializer(updated).data)

    def perform_destroy(self, instance: MemoryItem) -> None:
        services.memory_delete(instance)

    @extend_schema(
        summary="List a memory item's uses",
        description="Newest first: each run or chat that was given it in its prompt "
        "(injected), found it (searched) or saved it, and each edit by a person.",
        responses=MemoryUseSerializer(many=True),
        filters=False,
    )
    @action(detail=True, methods=["get"], filterset_class=None)
    def uses(self, request: Request, pk: str | None = None) -> Response:
        item = self.get_object()
        paginator = self.paginator
        assert paginator is not None
        page = paginator.paginate_queryset(item.uses.all(), request, view=self)
        data = MemoryUseSerializer(page, many=True).data
        return paginator.get_paginated_response(data)

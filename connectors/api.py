"""REST API: ``/api/v1/mcp-servers[/{name}]`` and ``POST /api/v1/mcp-servers/{name}/refresh``.

Reads need any role; registering, changing and removing a server need an admin (its tools
reach outside Loopwright, with credentials from the server's environment). Every write goes
through :mod:`connectors.services`, which lists the server's tools at once (the connection
test): the response shows them, or ``list_error``.
"""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from connectors import services
from connectors.models import SERVER_NAME, McpServer
from connectors.serializers import McpServerSerializer
from orchestrator.accounts.permissions import IsAdmin, ReadOrAdmin


@extend_schema_view(
    list=extend_schema(summary="List MCP servers"),
    retrieve=extend_schema(summary="Get an MCP server and its tools"),
    create=extend_schema(summary="Register an MCP server (its tools are listed at once)"),
    update=extend_schema(summary="Replace an MCP server's settings"),
    partial_update=extend_schema(summary="Change an MCP server's settings"),
    destroy=extend_schema(summary="Remove an MCP server"),
)
class McpServerViewSet(viewsets.ModelViewSet[McpServer]):
    """MCP servers whose tools agents may call as ``mcp__<server>__<tool>`` under the harness
    (``isolation.allowedConnectors``, ``tools``); header values stay in environment variables."""

    serializer_class = McpServerSerializer
    permission_classes = [ReadOrAdmin]
    lookup_field = "name"
    lookup_value_regex = SERVER_NAME.strip("^$")
    filterset_fields = ["enabled", "transport"]

    def get_queryset(self) -> QuerySet[McpServer]:
        return McpServer.objects.all()

    def perform_create(self, serializer: serializers.BaseSerializer[McpServer]) -> None:
        serializer.instance = services.mcp_server_create(**serializer.validated_data)

    def perform_update(self, serializer: serializers.BaseSerializer[McpServer]) -> None:
        assert serializer.instance is not None
        serializer.instance = services.mcp_server_update(
            server=serializer.instance, **serializer.validated_data
        )

    def perform_destroy(self, instance: McpServer) -> None:
        services.mcp_server_delete(server=instance)

    @extend_schema(
        summary="List an MCP server's tools again",
        request=None,
        responses=McpServerSerializer,
        description="Connects to the server, reads tools/list and stores it; a failure is "
        "reported in list_error and the tools listed before stay.",
    )
    @action(detail=True, methods=["post"], permission_classes=[IsAdmin])
    def refresh(self, request: Request, name: str) -> Response:
        server = services.mcp_server_refresh(self.get_object())
        return Response(McpServerSerializer(server, context={"request": request}).data)

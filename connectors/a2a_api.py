"""REST API: ``/api/v1/a2a-agents[/{name}]`` and ``POST /api/v1/a2a-agents/{name}/refresh``.

Reads need any role; registering, changing and removing an agent need an admin (its tool
reaches outside Loopwright, with credentials from the server's environment). Every write goes
through :mod:`connectors.a2a_services`, which reads the agent's card at once (the connection
test): the response shows it, or ``card_error``.
"""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from connectors import a2a_services as services
from connectors.a2a_serializers import A2AAgentSerializer
from connectors.models import SERVER_NAME, A2AAgent
from orchestrator.accounts.permissions import IsAdmin, ReadOrAdmin


@extend_schema_view(
    list=extend_schema(summary="List A2A agents"),
    retrieve=extend_schema(summary="Get an A2A agent and its card"),
    create=extend_schema(summary="Register an A2A agent (its card is read at once)"),
    update=extend_schema(summary="Replace an A2A agent's settings"),
    partial_update=extend_schema(summary="Change an A2A agent's settings"),
    destroy=extend_schema(summary="Remove an A2A agent"),
)
class A2AAgentViewSet(viewsets.ModelViewSet[A2AAgent]):
    """External A2A agents that agents may call as ``a2a__<agent>`` under the harness
    (``isolation.allowedConnectors``, ``tools``); header values stay in environment variables."""

    serializer_class = A2AAgentSerializer
    permission_classes = [ReadOrAdmin]
    lookup_field = "name"
    lookup_value_regex = SERVER_NAME.strip("^$")
    filterset_fields = ["enabled", "effect"]

    def get_queryset(self) -> QuerySet[A2AAgent]:
        return A2AAgent.objects.all()

    def perform_create(self, serializer: serializers.BaseSerializer[A2AAgent]) -> None:
        serializer.instance = services.a2a_agent_create(**serializer.validated_data)

    def perform_update(self, serializer: serializers.BaseSerializer[A2AAgent]) -> None:
        assert serializer.instance is not None
        serializer.instance = services.a2a_agent_update(
            agent=serializer.instance, **serializer.validated_data
        )

    def perform_destroy(self, instance: A2AAgent) -> None:
        services.a2a_agent_delete(agent=instance)

    @extend_schema(
        summary="Read an A2A agent's card again",
        request=None,
        responses=A2AAgentSerializer,
        description="Fetches the agent card and stores it; a failure is reported in "
        "card_error and the card read before stays.",
    )
    @action(detail=True, methods=["post"], permission_classes=[IsAdmin])
    def refresh(self, request: Request, name: str) -> Response:
        agent = services.a2a_agent_refresh(self.get_object())
        return Response(A2AAgentSerializer(agent, context={"request": request}).data)

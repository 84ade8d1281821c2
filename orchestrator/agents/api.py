"""REST API: ``/api/v1/model-endpoints[/{name}]``, ``/api/v1/model-aliases[/{name}]``,
``/api/v1/employees[/{username}]`` and ``/api/v1/employees/{username}/sub-agents[/{child}]``.

Reads need any role; writes need an operator (or admin). The views validate input with the
serializers and hand every write to :mod:`orchestrator.agents.services`.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from orchestrator.accounts.permissions import ReadOrOperator
from orchestrator.agents import aliases, services
from orchestrator.agents.clients import employee_get
from orchestrator.agents.models import (
    Employee,
    FailoverRoute,
    ModelAlias,
    ModelEndpoint,
    SubAgentBinding,
)
from orchestrator.agents.serializers import (
    EmployeeSerializer,
    ModelAliasSerializer,
    ModelEndpointSerializer,
    SubAgentBindingSerializer,
)

SLUG = r"[-a-zA-Z0-9_]+"


def _failover_specs(routes: list[dict[str, Any]]) -> list[services.FailoverSpec]:
    return [
        services.FailoverSpec(
            target=route["target"], model=route.get("model", ""), params=route.get("params")
        )
        for route in routes
    ]


def _endpoint_kwargs(data: dict[str, Any]) -> dict[str, Any]:
    fields = dict(data)
    routes = fields.pop("failover_routes", None)
    if routes is not None:
        fields["failover"] = _failover_specs(routes)
    return fields


@extend_schema_view(
    list=extend_schema(summary="List model endpoints"),
    retrieve=extend_schema(summary="Get a model endpoint"),
    create=extend_schema(summary="Create a model endpoint"),
    update=extend_schema(summary="Replace a model endpoint"),
    partial_update=extend_schema(summary="Change a model endpoint"),
    destroy=extend_schema(summary="Delete a model endpoint that nothing uses"),
)
class ModelEndpointViewSet(viewsets.ModelViewSet[ModelEndpoint]):
    """OpenAI-compatible or scripted model endpoints; keys stay in environment variables."""

    serializer_class = ModelEndpointSerializer
    permission_classes = [ReadOrOperator]
    lookup_field = "name"
    lookup_value_regex = SLUG
    filterset_fields = ["provider"]

    def get_queryset(self) -> QuerySet[ModelEndpoint]:
        routes = FailoverRoute.objects.select_related("target").order_by("priority")
        return ModelEndpoint.objects.prefetch_related(Prefetch("failover_routes", queryset=routes))

    def perform_create(self, serializer: serializers.BaseSerializer[ModelEndpoint]) -> None:
        serializer.instance = services.model_endpoint_create(
            **_endpoint_kwargs(serializer.validated_data)
        )

    def perform_update(self, serializer: serializers.BaseSerializer[ModelEndpoint]) -> None:
        assert serializer.instance is not None
        endpoint = services.model_endpoint_update(
            endpoint=serializer.instance, **_endpoint_kwargs(serializer.validated_data)
        )
        # Re-read so the response shows the routes as stored (the prefetch cache is stale).
        serializer.instance = self.get_queryset().get(pk=endpoint.pk)

    def perform_destroy(self, instance: ModelEndpoint) -> None:
        services.model_endpoint_delete(endpoint=instance)


@extend_schema_view(
    list=extend_schema(summary="List model aliases"),
    retrieve=extend_schema(summary="Get a model alias"),
    create=extend_schema(summary="Create a model alias"),
    update=extend_schema(summary="Replace a model alias"),
    partial_update=extend_schema(summary="Change a model alias"),
    destroy=extend_schema(summary="Delete a model alias no employee uses"),
)
class ModelAliasViewSet(viewsets.ModelViewSet[ModelAlias]):
    """Model aliases: rules routing an employee's calls to endpoints by pattern, role, cost
    ceiling and health (docs/model-routing.md)."""

    serializer_class = ModelAliasSerializer
    permission_classes = [ReadOrOperator]
    lookup_field = "name"
    lookup_value_regex = SLUG

    def get_queryset(self) -> QuerySet[ModelAlias]:
        return ModelAlias.objects.prefetch_related("employees")

    def perform_create(self, serializer: serializers.BaseSerializer[ModelAlias]) -> None:
        serializer.instance = aliases.alias_create(
            actor=self.request.user.get_username(), **serializer.validated_data
        )

    def perform_update(self, serializer: serializers.BaseSerializer[ModelAlias]) -> None:
        assert serializer.instance is not None
        alias = aliases.alias_update(
            alias=serializer.instance,
            actor=self.request.user.get_username(),
            **serializer.validated_data,
        )
        serializer.instance = self.get_queryset().get(pk=alias.pk)

    def perform_destroy(self, instance: ModelAlias) -> None:
        aliases.alias_delete(alias=instance)


@extend_schema_view(
    list=extend_schema(summary="List AI employees"),
    retrieve=extend_schema(summary="Get an AI employee"),
    create=extend_schema(summary="Create an AI employee"),
    update=extend_schema(summary="Replace an AI employee"),
    partial_update=extend_schema(summary="Change an AI employee"),
    destroy=extend_schema(summary="Delete an AI employee"),
)
class EmployeeViewSet(viewsets.ModelViewSet[Employee]):
    """AI employees: a username with a model endpoint, a system prompt, limits and tools."""

    serializer_class = EmployeeSerializer
    permission_classes = [ReadOrOperator]
    lookup_field = "username"
    lookup_value_regex = SLUG
    filterset_fields = ["endpoint__name", "streaming"]

    def get_queryset(self) -> QuerySet[Employee]:
        return Employee.objects.select_related("endpoint", "model_alias")

    def perform_create(self, serializer: serializers.BaseSerializer[Employee]) -> None:
        serializer.instance = services.employee_create(**serializer.validated_data)

    def perform_update(self, serializer: serializers.BaseSerializer[Employee]) -> None:
        assert serializer.instance is not None
        serializer.instance = services.employee_update(
            employee=serializer.instance, **serializer.validated_data
        )

    def perform_destroy(self, instance: Employee) -> None:
        services.employee_delete(employee=instance)


@extend_schema_view(
    list=extend_schema(summary="List an employee's sub-agents"),
    create=extend_schema(summary="Bind a sub-agent to an employee"),
    destroy=extend_schema(summary="Remove a sub-agent binding"),
)
class SubAgentBindingViewSet(
    mixins.ListModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet[SubAgentBinding],
):
    """The employees ``{username}`` may hand tasks to with ``dispatch_sub_agent_task``."""

    serializer_class = SubAgentBindingSerializer
    permission_classes = [ReadOrOperator]
    lookup_field = "child"
    lookup_value_regex = SLUG
    pagination_class = None

    def parent(self) -> Employee:
        return employee_get(username=self.kwargs["username"])

    def get_queryset(self) -> QuerySet[SubAgentBinding]:
        if getattr(self, "swagger_fake_view", False):
            return SubAgentBinding.objects.none()
        return SubAgentBinding.objects.filter(parent=self.parent()).select_related(
            "child", "endpoint"
        )

    def perform_create(self, serializer: serializers.BaseSerializer[SubAgentBinding]) -> None:
        serializer.instance = services.sub_agent_binding_create(
            parent=self.parent(), **serializer.validated_data
        )

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.sub_agent_binding_delete(parent=self.parent(), child_username=kwargs["child"])
        return Response(status=status.HTTP_204_NO_CONTENT)

"""REST API of the OpenAI-compatible endpoint's configuration: ``/api/v1/employee-grants``,
``/api/v1/chat-completions`` (records) and ``/api/v1/employees/{username}/guardrails``.

Reads need any role; grant and guardrail writes need an admin (they decide who may call an
employee and what passes). The views validate with the serializers and hand writes to
:mod:`gateway.services`.
"""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, serializers, viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gateway import services
from gateway.models import ChatCompletionRecord, CompletionStatus, EmployeeGrant
from gateway.serializers import (
    ChatCompletionRecordSerializer,
    EmployeeGrantSerializer,
    GuardrailSettingsSerializer,
)
from orchestrator.accounts.actors import request_actor
from orchestrator.accounts.permissions import ReadOrAdmin
from orchestrator.agents.clients import employee_get


class GrantFilter(django_filters.FilterSet):
    employee = django_filters.CharFilter(field_name="employee__username")
    user = django_filters.CharFilter(field_name="user__username")

    class Meta:
        model = EmployeeGrant
        fields = ["employee", "user"]


@extend_schema_view(
    list=extend_schema(summary="List who may call which AI employee"),
    retrieve=extend_schema(summary="Get a grant"),
    create=extend_schema(summary="Let a user call an AI employee at /v1/chat/completions"),
    destroy=extend_schema(summary="Withdraw a grant"),
)
class EmployeeGrantViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet[EmployeeGrant],
):
    """Grants: a user may call an employee over the OpenAI-compatible endpoint only with one
    (admins always may)."""

    serializer_class = EmployeeGrantSerializer
    permission_classes = [ReadOrAdmin]
    filterset_class = GrantFilter

    def get_queryset(self) -> QuerySet[EmployeeGrant]:
        return EmployeeGrant.objects.select_related("employee", "user")

    def perform_create(self, serializer: serializers.BaseSerializer[EmployeeGrant]) -> None:
        data = serializer.validated_data
        serializer.instance = services.grant_create(
            employee=data["employee"], user=data["user"], actor=request_actor(self.request)
        )

    def perform_destroy(self, instance: EmployeeGrant) -> None:
        services.grant_delete(
            employee=instance.employee, user=instance.user, actor=request_actor(self.request)
        )


class RecordFilter(django_filters.FilterSet):
    employee = django_filters.CharFilter(field_name="employee_username")
    user = django_filters.CharFilter(field_name="user__username")
    status = django_filters.ChoiceFilter(choices=CompletionStatus.choices)

    class Meta:
        model = ChatCompletionRecord
        fields = ["employee", "user", "status"]


@extend_schema_view(
    list=extend_schema(summary="List chat completion requests (no message contents)"),
    retrieve=extend_schema(summary="Get one chat completion request's record"),
)
class ChatCompletionRecordViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet[ChatCompletionRecord],
):
    """One record per /v1/chat/completions request: status, usage, guardrail decisions."""

    serializer_class = ChatCompletionRecordSerializer
    permission_classes = [ReadOrAdmin]
    filterset_class = RecordFilter
    lookup_value_regex = r"[-a-zA-Z0-9_]{1,64}"

    def get_queryset(self) -> QuerySet[ChatCompletionRecord]:
        return ChatCompletionRecord.objects.select_related("user")


class EmployeeGuardrailsView(APIView):
    """An employee's guardrail configuration for the OpenAI-compatible endpoint."""

    permission_classes = [ReadOrAdmin]

    @extend_schema(summary="Get an AI employee's guardrails", responses=GuardrailSettingsSerializer)
    def get(self, request: Request, username: str) -> Response:
        settings = services.chat_settings_of(employee_get(username=username))
        return Response(GuardrailSettingsSerializer.of(settings))

    @extend_schema(
        summary="Replace an AI employee's guardrails",
        request=GuardrailSettingsSerializer,
        responses=GuardrailSettingsSerializer,
    )
    def put(self, request: Request, username: str) -> Response:
        employee = employee_get(username=username)
        body = GuardrailSettingsSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        settings = services.guardrails_update(
            employee=employee,
            guardrails=body.validated_data["guardrails"],
            actor=request_actor(request),
        )
        return Response(GuardrailSettingsSerializer.of(settings))

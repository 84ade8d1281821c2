"""REST endpoints for triggers: event intake, event keys (admin) and a pattern's cron schedule."""

from __future__ import annotations

import json
from typing import Any

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from loops.models import EventKey, LoopPattern
from loops.triggers.events import (
    MAX_IDEMPOTENCY_KEY,
    EventAuthFailed,
    event_deliver,
    event_key_create,
    event_key_delete,
    event_key_known_for_token,
    event_key_rotate,
    event_key_update,
    event_signature_verify,
)
from loops.triggers.scheduler import pattern_schedule
from orchestrator.accounts.actors import request_actor
from orchestrator.accounts.authentication import BearerTokenAuthentication
from orchestrator.accounts.permissions import IsAdmin, IsViewer
from orchestrator.accounts.roles import Role, has_role
from orchestrator.errors import InvalidInput, NotFound, refused_json
from orchestrator.jsonlimits import JsonRefused, loads_bounded
from orchestrator.strict import StrictModelSerializer, StrictSerializer

TIMESTAMP_HEADER = "X-Loopwright-Timestamp"
SIGNATURE_HEADER = "X-Loopwright-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"


# --- cron schedule -------------------------------------------------------------------------------


class CronFireSerializer(StrictSerializer):
    scheduled_for = serializers.DateTimeField()
    fired_at = serializers.DateTimeField()
    outcome = serializers.ChoiceField(choices=["started", "refused"])
    reason = serializers.CharField()
    run = serializers.UUIDField(allow_null=True)
    missed = serializers.IntegerField(help_text="Due times folded into this fire or dropped.")


class PatternScheduleSerializer(StrictSerializer):
    pattern = serializers.CharField()
    trigger_type = serializers.CharField()
    cron_expression = serializers.CharField()
    timezone = serializers.CharField()
    missed_fire_policy = serializers.CharField()
    enabled = serializers.BooleanField()
    next_fire_at = serializers.DateTimeField(allow_null=True)
    next_fires = serializers.ListField(child=serializers.DateTimeField())
    paused_reason = serializers.CharField(help_text="Why nothing will fire ('' when scheduled).")
    last_fired_at = serializers.DateTimeField(allow_null=True)
    missed_total = serializers.IntegerField()
    recent_fires = CronFireSerializer(many=True)


class PatternScheduleView(APIView):
    """The cron schedule of a pattern: next fire time (UTC), the next five, the recent fires."""

    permission_classes = [IsViewer]

    @extend_schema(responses={200: PatternScheduleSerializer}, operation_id="patterns_schedule")
    def get(self, request: Request, key: str) -> Response:
        pattern = LoopPattern.objects.filter(key=key).first()
        if pattern is None:
            raise NotFound(f"No pattern {key!r}.")
        return Response(pattern_schedule(pattern, now=timezone.now()))


# --- event keys ----------------------------------------------------------------------------------


class EventKeySerializer(StrictModelSerializer[EventKey]):
    tolerance_seconds = serializers.IntegerField(min_value=1, max_value=86_400, required=False)

    class Meta:
        model = EventKey
        fields = [
            "key", "description", "tolerance_seconds", "enabled", "created_by", "created_at",
            "rotated_at",
        ]  # fmt: skip
        read_only_fields = ["created_by", "created_at", "rotated_at"]


class EventKeyUpdateSerializer(EventKeySerializer):
    class Meta(EventKeySerializer.Meta):
        read_only_fields = ["key", "created_by", "created_at", "rotated_at"]


class EventKeySecretSerializer(EventKeySerializer):
    secret = serializers.CharField(
        read_only=True, help_text="Shown only in this response; store it now."
    )

    class Meta(EventKeySerializer.Meta):
        fields = [*EventKeySerializer.Meta.fields, "secret"]


def _with_secret(row: EventKey, secret: str) -> dict[str, Any]:
    return {**EventKeySerializer(row).data, "secret": secret}


class EventKeyViewSet(viewsets.ModelViewSet[EventKey]):
    """Event keys (admins only). The signing secret is returned by create and rotate, once."""

    queryset = EventKey.objects.all()
    serializer_class = EventKeySerializer
    permission_classes = [IsAdmin]
    lookup_field = "key"

    def get_serializer_class(self) -> type[EventKeySerializer]:
        if self.action in ("update", "partial_update"):
            return EventKeyUpdateSerializer
        return EventKeySerializer

    @extend_schema(request=EventKeySerializer, responses={201: EventKeySecretSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = EventKeySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        row, secret = event_key_create(actor=request_actor(request), **dict(body.validated_data))
        return Response(_with_secret(row, secret), status=status.HTTP_201_CREATED)

    def perform_update(self, serializer: EventKeySerializer) -> None:  # type: ignore[override]
        assert serializer.instance is not None
        serializer.instance = event_key_update(
            event_key=serializer.instance, **dict(serializer.validated_data)
        )

    def perform_destroy(self, instance: EventKey) -> None:
        event_key_delete(event_key=instance)

    @extend_schema(request=None, responses={200: EventKeySecretSerializer})
    @action(detail=True, methods=["post"])
    def rotate(self, request: Request, key: str | None = None) -> Response:
        """Replace the secret now; deliveries signed with the old one are refused from now on."""
        row, secret = event_key_rotate(event_key=self.get_object())
        return Response(_with_secret(row, secret))


# --- event intake --------------------------------------------------------------------------------


class EventDeliveryRunSerializer(StrictSerializer):
    id = serializers.UUIDField()
    pattern = serializers.CharField()
    status = serializers.CharField()


class EventRefusalSerializer(StrictSerializer):
    pattern = serializers.CharField()
    reason = serializers.CharField()
    code = serializers.ChoiceField(choices=["refused", "template_error"])


class EventDeliverySerializer(StrictSerializer):
    delivery_id = serializers.UUIDField()
    event_key = serializers.CharField()
    received_at = serializers.DateTimeField()
    runs = EventDeliveryRunSerializer(many=True)
    refused = EventRefusalSerializer(many=True)


def _idempotency_key(request: Request) -> str | None:
    value = request.headers.get(IDEMPOTENCY_HEADER)
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > MAX_IDEMPOTENCY_KEY or not value.isprintable():
        raise InvalidInput(
            f"{IDEMPOTENCY_HEADER} must be 1 to {MAX_IDEMPOTENCY_KEY} printable characters."
        )
    return value


def _payload(raw: bytes) -> dict[str, Any]:
    try:
        payload = loads_bounded(raw.decode("utf-8")) if raw.strip() else None
    except JsonRefused as exc:
        raise refused_json(exc) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"The body is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise InvalidInput("The event payload must be a JSON object.")
    return payload


class EventIngestView(APIView):
    """Deliver an event: start a run of every enabled pattern subscribed to the key.

    Authenticate with an operator's bearer API token, or sign the raw body: send
    ``X-Loopwright-Timestamp: <unix seconds>`` and ``X-Loopwright-Signature: sha256=<hex>``
    where hex is HMAC-SHA256 of ``<timestamp>.<raw body>`` with the event key's secret. An
    ``Idempotency-Key`` header makes retries return the first answer (200 with
    ``Idempotent-Replayed: true``) instead of starting runs again.
    """

    # Authentication is done here, after the raw body is read and before it is parsed.
    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]

    def get_authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="loopwright"'

    @extend_schema(
        request={"application/json": OpenApiTypes.OBJECT},
        parameters=[
            OpenApiParameter(IDEMPOTENCY_HEADER, str, OpenApiParameter.HEADER),
            OpenApiParameter(TIMESTAMP_HEADER, int, OpenApiParameter.HEADER),
            OpenApiParameter(SIGNATURE_HEADER, str, OpenApiParameter.HEADER),
        ],
        responses={
            202: EventDeliverySerializer,
            200: OpenApiResponse(EventDeliverySerializer, description="Idempotent replay"),
        },
        operation_id="events_deliver",
    )
    def post(self, request: Request, event_key: str) -> Response:
        raw = request.body  # the exact bytes a signature covers, read before any parsing
        try:
            principal, signature = self._authenticate(request, event_key, raw)
            outcome = event_deliver(
                event_key=event_key,
                payload=_payload(raw),
                principal=principal,
                idempotency_key=_idempotency_key(request),
                signature=signature,
            )
        except EventAuthFailed as exc:  # a 401 carries WWW-Authenticate: let DRF add it
            raise exceptions.AuthenticationFailed(exc.detail) from exc
        if outcome.replayed:
            return Response(
                outcome.body, status=status.HTTP_200_OK, headers={REPLAYED_HEADER: "true"}
            )
        return Response(outcome.body, status=status.HTTP_202_ACCEPTED)

    def _authenticate(self, request: Request, event_key: str, raw: bytes) -> tuple[str, str | None]:
        """(principal, accepted signature or None); raises 401/403/404 problems."""
        found = BearerTokenAuthentication().authenticate(request)
        if found is not None:
            user = found[0]
            if not has_role(user, Role.OPERATOR):
                raise exceptions.PermissionDenied("Delivering events needs the operator role.")
            event_key_known_for_token(event_key)
            return str(user.username), None
        if SIGNATURE_HEADER not in request.headers and TIMESTAMP_HEADER not in request.headers:
            raise exceptions.NotAuthenticated(
                f"Send a bearer API token, or sign the body ({TIMESTAMP_HEADER} and "
                f"{SIGNATURE_HEADER})."
            )
        signature = event_signature_verify(
            event_key=event_key,
            timestamp=request.headers.get(TIMESTAMP_HEADER),
            signature=request.headers.get(SIGNATURE_HEADER),
            body=raw,
            now=timezone.now(),
        )
        return f"hmac:{event_key}", signature

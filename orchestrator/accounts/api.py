"""``/api/v1/api-tokens``: the API tokens (admins only), created (POST: the full token is in
that one response), listed and read without their secrets, revoked (POST ``…/revoke``); a
token's daily quotas at the OpenAI-compatible endpoint are changed with PATCH.

Holds: no response but the creating one carries a token's secret, and none its hash; tokens
are also created with ``manage.py create_api_token`` (which prints the secret once).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from orchestrator.accounts.models import ApiToken
from orchestrator.accounts.permissions import IsAdmin
from orchestrator.accounts.roles import Role
from orchestrator.accounts.token_admin import (
    NAME_MAX,
    USERNAME_MAX,
    api_token_issue,
    api_token_revoke,
)
from orchestrator.accounts.token_quotas import api_token_quotas_update
from orchestrator.strict import StrictModelSerializer, StrictSerializer

#: The most a token quota may be (the column is a 64-bit integer).
MAX_TOKEN_QUOTA = 2**63 - 1


class ApiTokenSerializer(StrictModelSerializer[ApiToken]):
    """An API token, never its secret or the secret's hash; only the daily quotas are
    writable (null: no quota)."""

    user: serializers.SlugRelatedField[User] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, help_text="The user the token acts as."
    )

    class Meta:
        model = ApiToken
        fields = [
            "prefix", "user", "name", "created_at", "last_used_at", "expires_at", "revoked_at",
            "daily_token_quota", "daily_cost_quota",
        ]  # fmt: skip
        read_only_fields = [
            "prefix", "name", "created_at", "last_used_at", "expires_at", "revoked_at",
        ]  # fmt: skip
        extra_kwargs = {
            "prefix": {"help_text": "The token's public part: the token reads lw_<prefix>_…"},
            "daily_token_quota": {"min_value": 0, "max_value": MAX_TOKEN_QUOTA},
            "daily_cost_quota": {"min_value": 0},
        }


class ApiTokenCreateSerializer(StrictSerializer):
    """A token to create, as ``manage.py create_api_token``: the user is created if it does not
    exist and is granted the roles (roles belong to the user, not to the token)."""

    username = serializers.CharField(
        max_length=USERNAME_MAX,
        help_text="The user the token acts as; created when it does not exist.",
    )
    roles = serializers.ListField(
        child=serializers.ChoiceField(choices=[r.value for r in Role]),
        min_length=1,
        help_text="Roles granted to the user (added to those it holds): admin, operator, "
        "approver, viewer.",
    )
    name = serializers.CharField(
        max_length=NAME_MAX, required=False, default="api", help_text="A label for the token."
    )
    expires_at = serializers.DateTimeField(
        required=False,
        allow_null=True,
        default=None,
        help_text="When the token stops working (in the future); null: never.",
    )
    daily_token_quota = serializers.IntegerField(
        required=False,
        allow_null=True,
        default=None,
        min_value=0,
        max_value=MAX_TOKEN_QUOTA,
        help_text="The most tokens its chat completions may use per UTC day; null: no quota.",
    )
    daily_cost_quota = serializers.DecimalField(
        max_digits=12,
        decimal_places=4,
        required=False,
        allow_null=True,
        default=None,
        min_value=0,
        help_text="The most cost its chat completions may use per UTC day; null: no quota.",
    )


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    """The token just created, with its full text: shown in this response only, never again."""

    token = serializers.CharField(
        read_only=True,
        help_text="The full token (lw_<prefix>_<secret>): send it as 'Authorization: Bearer "
        "…'. Only this response carries it; keep it now.",
    )

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]


@extend_schema_view(
    list=extend_schema(summary="List API tokens (never their secrets)"),
    retrieve=extend_schema(summary="Get an API token (never its secret)"),
    partial_update=extend_schema(summary="Set an API token's daily token and cost quotas"),
)
class ApiTokenViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet[ApiToken],
):
    """API tokens, by their prefix: created (the full token once), revoked, and their daily
    quotas changed (PATCH; null: none)."""

    serializer_class = ApiTokenSerializer
    permission_classes = [IsAdmin]
    lookup_field = "prefix"
    lookup_value_regex = r"[0-9a-f]{1,16}"
    http_method_names = ["get", "post", "patch", "head", "options"]

    def get_queryset(self) -> QuerySet[ApiToken]:
        return ApiToken.objects.select_related("user")

    def perform_update(self, serializer: serializers.BaseSerializer[ApiToken]) -> None:
        assert serializer.instance is not None
        values: dict[str, Any] = dict(serializer.validated_data)
        serializer.instance = api_token_quotas_update(token=serializer.instance, **values)

    @extend_schema(
        summary="Create an API token (its secret is in this response only)",
        description="Creates the user if it does not exist, grants it the roles and makes a "
        "token for it, in one transaction (as `manage.py create_api_token`). The response's "
        "`token` is the only time the secret is shown; it is stored hashed. Bad input is a 400 "
        "problem naming each field (an expiry not in the future, an unknown role, a quota that "
        "does not fit).",
        request=ApiTokenCreateSerializer,
        responses={201: ApiTokenCreatedSerializer},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = ApiTokenCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        row, token = api_token_issue(**dict(body.validated_data))
        row.token = token  # type: ignore[attr-defined]
        return Response(ApiTokenCreatedSerializer(row).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Revoke an API token",
        description="Sets `revoked_at` now; the token is refused from the next request on, by "
        "the API, the OpenAI-compatible endpoint, MCP and A2A. Idempotent: revoking a revoked "
        "token changes nothing and answers the same.",
        request=None,
        responses={200: ApiTokenSerializer},
    )
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, prefix: str | None = None) -> Response:
        return Response(ApiTokenSerializer(api_token_revoke(token=self.get_object())).data)

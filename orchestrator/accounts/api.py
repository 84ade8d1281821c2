"""``/api/v1/api-tokens``: the API tokens (admins only), listed and read without their secrets;
a token's daily quotas at the OpenAI-compatible endpoint are changed with PATCH.

Holds: no response of this API carries a token's secret or its hash; tokens are created with
``manage.py create_api_token`` (which prints the secret once).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, serializers, viewsets

from orchestrator.accounts.models import ApiToken
from orchestrator.accounts.permissions import IsAdmin
from orchestrator.accounts.token_quotas import api_token_quotas_update
from orchestrator.strict import StrictModelSerializer

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
    """API tokens, by their prefix. Only the daily quotas are writable (PATCH; null: none)."""

    serializer_class = ApiTokenSerializer
    permission_classes = [IsAdmin]
    lookup_field = "prefix"
    lookup_value_regex = r"[0-9a-f]{1,16}"
    http_method_names = ["get", "patch", "head", "options"]

    def get_queryset(self) -> QuerySet[ApiToken]:
        return ApiToken.objects.select_related("user")

    def perform_update(self, serializer: serializers.BaseSerializer[ApiToken]) -> None:
        assert serializer.instance is not None
        values: dict[str, Any] = dict(serializer.validated_data)
        serializer.instance = api_token_quotas_update(token=serializer.instance, **values)

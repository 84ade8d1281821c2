"""API tokens in the admin: quotas, expiry and revocation are editable; a token is never added
here (it would have no secret): the API, the UI's API tokens page or ``create_api_token``
make them."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from orchestrator.accounts.models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin[ApiToken]):
    list_display = (
        "prefix",
        "user",
        "name",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
        "daily_token_quota",
        "daily_cost_quota",
    )
    readonly_fields = ("prefix", "secret_hash", "created_at", "last_used_at")
    search_fields = ("prefix", "user__username", "name")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

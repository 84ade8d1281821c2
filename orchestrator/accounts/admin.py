from __future__ import annotations

from django.contrib import admin

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

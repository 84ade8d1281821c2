from __future__ import annotations

from django.contrib import admin
from django.db import models

from orchestrator.agents.models import (
    Employee,
    FailoverRoute,
    ModelAlias,
    ModelEndpoint,
    SubAgentBinding,
)
from runtime.secrets import api_key_configured


class FailoverRouteInline(admin.TabularInline[FailoverRoute, ModelEndpoint]):
    model = FailoverRoute
    fk_name = "source"
    extra = 0
    fields = ("priority", "target", "model", "params")
    ordering = ("priority",)


@admin.register(ModelEndpoint)
class ModelEndpointAdmin(admin.ModelAdmin[ModelEndpoint]):
    list_display = (
        "name",
        "provider",
        "model",
        "base_url",
        "api_key_env",
        "key_configured",
        "max_retries",
        "circuit_cooldown_seconds",
    )
    list_filter = ("provider",)
    search_fields = ("name", "model", "base_url")
    readonly_fields = ("created_at", "updated_at")
    inlines = (FailoverRouteInline,)
    # Django 5.x warns unless the scheme assumed for "host/path" input is chosen explicitly.
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    fieldsets = (
        (None, {"fields": ("name", "provider", "base_url", "model", "script")}),
        (
            "Credentials",
            {
                "fields": ("api_key_env",),
                "description": "Only the variable's name: it must start with the secret prefix "
                "(LOOPWRIGHT_SECRET_PREFIX, default LOOPWRIGHT_SECRET_) or be listed in "
                "LOOPWRIGHT_SECRET_ALLOW; the server's own variables are refused.",
            },
        ),
        ("Parameters", {"fields": ("params", "context_window", "vision")}),
        ("Cost", {"fields": ("input_price_per_token", "output_price_per_token")}),
        (
            "Resilience",
            {"fields": ("max_retries", "timeout_seconds", "circuit_cooldown_seconds")},
        ),
        (None, {"fields": ("created_at", "updated_at")}),
    )

    @admin.display(boolean=True, description="key set")
    def key_configured(self, endpoint: ModelEndpoint) -> bool:
        return api_key_configured(endpoint.api_key_env)


@admin.register(SubAgentBinding)
class SubAgentBindingAdmin(admin.ModelAdmin[SubAgentBinding]):
    """Who may hand tasks to whom with ``dispatch_sub_agent_task`` (docs/sub-agents.md)."""

    list_display = ("parent", "child", "endpoint", "model", "alternatives", "created_at")
    list_select_related = ("parent", "child", "endpoint")
    search_fields = ("parent__username", "child__username")
    readonly_fields = ("created_at",)


@admin.register(ModelAlias)
class ModelAliasAdmin(admin.ModelAdmin[ModelAlias]):
    """Rules as JSON (docs/model-routing.md); the model's ``clean`` checks them and their
    targets."""

    list_display = ("name", "description", "updated_at", "updated_by")
    search_fields = ("name", "description")
    readonly_fields = ("created_at", "updated_at", "updated_by")


@admin.register(Employee)
class EmployeeAdmin(admin.ModelAdmin[Employee]):
    list_display = ("username", "display_name", "endpoint", "max_steps", "harness_tag", "streaming")
    list_filter = ("streaming", "stream_tool_call_check", "endpoint")
    search_fields = ("username", "display_name")
    list_select_related = ("endpoint",)
    readonly_fields = ("created_at", "updated_at")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "username",
                    "display_name",
                    "endpoint",
                    "model_alias",
                    "system_prompt",
                    "preset_messages",
                    "params",
                )
            },
        ),
        (
            "Limits and tools",
            {
                "fields": (
                    "max_steps",
                    "tools",
                    "tool_concurrency",
                    "tool_timeout_seconds",
                    "max_tool_output_length",
                    "streaming",
                    "stream_tool_call_check",
                    "stream_retry_mode",
                )
            },
        ),
        (
            "Harness",
            {
                "fields": ("harness_tag", "harness"),
                "description": "The employee's own harness layers, stacked on its runs after the "
                "pattern's: a published profile (tag or tag@N) and/or inline layer settings "
                '(camelCase JSON, e.g. {"limits": {"recursionLimit": 5}}). They only tighten.',
            },
        ),
        (None, {"fields": ("created_at", "updated_at")}),
    )

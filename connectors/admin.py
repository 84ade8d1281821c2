from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from connectors.models import McpServer
from connectors.services import mcp_server_refresh


@admin.register(McpServer)
class McpServerAdmin(admin.ModelAdmin[McpServer]):
    """Servers as the API shows them; saving one lists its tools again."""

    list_display = ["name", "url", "transport", "enabled", "tools_listed_at", "list_error"]
    list_filter = ["enabled", "transport"]
    readonly_fields = ["tools", "tools_listed_at", "list_error", "created_at", "updated_at"]

    def save_model(self, request: HttpRequest, obj: McpServer, form: object, change: bool) -> None:
        super().save_model(request, obj, form, change)
        mcp_server_refresh(obj)

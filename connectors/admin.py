from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from connectors.a2a_services import a2a_agent_refresh
from connectors.models import A2AAgent, McpServer
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


@admin.register(A2AAgent)
class A2AAgentAdmin(admin.ModelAdmin[A2AAgent]):
    """Agents as the API shows them; saving one reads its card again."""

    list_display = ["name", "card_url", "effect", "enabled", "card_read_at", "card_error"]
    list_filter = ["enabled", "effect"]
    readonly_fields = ["card", "card_read_at", "card_error", "created_at", "updated_at"]

    def save_model(self, request: HttpRequest, obj: A2AAgent, form: object, change: bool) -> None:
        super().save_model(request, obj, form, change)
        a2a_agent_refresh(obj)

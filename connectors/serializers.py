"""API shapes of MCP servers. A header's value never appears: only the environment variable
that holds it, and whether that variable is allowed and set in this process."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from connectors.models import McpServer
from connectors.naming import effect_of
from orchestrator.strict import StrictModelSerializer
from runtime import outbound
from runtime.secrets import api_key_configured


def guard_url(value: str) -> None:
    """The outbound guard's static checks, with the rule in the refusal (its addresses are
    checked when the row is saved, and on every connection)."""
    try:
        outbound.check_url(value, outbound.current_policy())
    except outbound.OutboundRefused as exc:
        raise serializers.ValidationError(f"url refused: {exc}") from None


class McpServerSerializer(StrictModelSerializer[McpServer]):
    url = serializers.URLField(
        max_length=500,
        validators=[guard_url],
        help_text="The server's MCP endpoint (streamable HTTP, or the SSE endpoint of older "
        "servers); checked by the outbound guard when saved and on every connection.",
    )
    headers = serializers.DictField(
        child=serializers.CharField(max_length=100),
        required=False,
        help_text="Header name → the environment variable holding its value (a name the "
        "secret rule allows, e.g. LOOPWRIGHT_SECRET_GITHUB_TOKEN); values are never stored.",
    )
    headers_configured = serializers.SerializerMethodField(
        help_text="Per header: whether its variable is allowed and set in this server process."
    )
    tools_filter = serializers.ListField(
        child=serializers.CharField(max_length=128),
        required=False,
        help_text="The server's tool names to offer; empty offers all of them.",
    )
    tools = serializers.SerializerMethodField(
        help_text="The server's tools as last listed: name, description, offered_as "
        "(mcp__<server>__<tool>, null when the name cannot be offered), skipped (why not), "
        "effect (read, write or external, from the annotations), idempotent, offered "
        "(false when tools_filter leaves it out), input_schema."
    )

    class Meta:
        model = McpServer
        fields = [
            "name",
            "url",
            "transport",
            "headers",
            "headers_configured",
            "timeout_seconds",
            "tools_filter",
            "enabled",
            "tools",
            "tools_listed_at",
            "list_error",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["tools_listed_at", "list_error", "created_at", "updated_at"]

    def get_headers_configured(self, server: McpServer) -> dict[str, bool]:
        return {h: api_key_configured(v) for h, v in (server.headers or {}).items()}

    def get_tools(self, server: McpServer) -> list[dict[str, Any]]:
        wanted = set(server.tools_filter or [])
        return [
            {
                "name": tool["name"],
                "description": tool.get("description", ""),
                "offered_as": tool.get("offered_as"),
                "skipped": tool.get("skipped", ""),
                "effect": effect_of(tool.get("annotations") or {}).value,
                "idempotent": (tool.get("annotations") or {}).get("idempotentHint") is True,
                "offered": bool(tool.get("offered_as")) and (not wanted or tool["name"] in wanted),
                "input_schema": tool.get("input_schema") or {},
            }
            for tool in server.tools or []
        ]

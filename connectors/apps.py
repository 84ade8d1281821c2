from __future__ import annotations

from django.apps import AppConfig

from runtime.tools.registry import tool_provider_register


class ConnectorsConfig(AppConfig):
    name = "connectors"
    verbose_name = "Connectors (MCP servers)"

    def ready(self) -> None:
        from connectors.tools import MCP_TOOLS

        # MCP servers' tools become tools of the production registry (runs, requests, approvals).
        tool_provider_register(MCP_TOOLS)

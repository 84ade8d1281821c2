from __future__ import annotations

from django.apps import AppConfig

from runtime.tools.registry import tool_provider_register


class ConnectorsConfig(AppConfig):
    name = "connectors"
    verbose_name = "Connectors (MCP servers, A2A agents)"

    def ready(self) -> None:
        from connectors.a2a_services import a2a_calls_abandoned
        from connectors.a2a_tools import A2A_TOOLS
        from connectors.tools import MCP_TOOLS
        from runtime.run_cancellation import calls_abandoned_listener_register

        # MCP servers' tools and A2A agents become tools of the production registry (runs,
        # requests, approvals).
        tool_provider_register(MCP_TOOLS)
        tool_provider_register(A2A_TOOLS)
        # A run that ends while an agent's question waits cancels that agent's remote task.
        calls_abandoned_listener_register(a2a_calls_abandoned)

from __future__ import annotations

from django.apps import AppConfig

from runtime.tools.registry import tool_provider_register


class KnowledgeConfig(AppConfig):
    name = "knowledge"
    verbose_name = "Knowledge bases"

    def ready(self) -> None:
        from knowledge.tools import KNOWLEDGE_TOOLS

        # knowledge_search and external_rag_search become tools of the production registry
        # (runs, chats, approvals), offered to the employees that bind them.
        tool_provider_register(KNOWLEDGE_TOOLS)

from __future__ import annotations

from django.apps import AppConfig


class MemoryConfig(AppConfig):
    name = "memory"
    verbose_name = "Agent memory"

    def ready(self) -> None:
        from memory.prompt import MEMORY_PROMPT
        from memory.tools import MEMORY_TOOLS
        from runtime.prompt_context import prompt_context_register
        from runtime.tools.registry import tool_provider_register

        # The <agent_memory_context> block of every employee's prompt, and the memory tools
        # of the production registry (runs and chats).
        prompt_context_register(MEMORY_PROMPT)
        tool_provider_register(MEMORY_TOOLS)

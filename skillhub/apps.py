from __future__ import annotations

from django.apps import AppConfig

from runtime.prompt_context import prompt_context_register
from runtime.tools.registry import tool_provider_register


class SkillhubConfig(AppConfig):
    name = "skillhub"
    verbose_name = "Skill Hub"

    def ready(self) -> None:
        from skillhub.directory_tools import SKILL_CATALOGUE_PROMPT, SKILL_DIRECTORY_TOOLS
        from skillhub.tools import SKILL_TOOLS

        # Skills become tools of the production registry (AgentInvoker, approval re-checks).
        tool_provider_register(SKILL_TOOLS)
        # Skills directories: the `skill` tool and the <available_skills> prompt block.
        tool_provider_register(SKILL_DIRECTORY_TOOLS)
        prompt_context_register(SKILL_CATALOGUE_PROMPT)

from __future__ import annotations

from django.apps import AppConfig

from runtime.tools.registry import tool_provider_register


class SkillhubConfig(AppConfig):
    name = "skillhub"
    verbose_name = "Skill Hub"

    def ready(self) -> None:
        from skillhub.tools import SKILL_TOOLS

        # Skills become tools of the production registry (AgentInvoker, approval re-checks).
        tool_provider_register(SKILL_TOOLS)

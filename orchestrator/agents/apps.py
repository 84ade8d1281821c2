from __future__ import annotations

from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "orchestrator.agents"
    label = "agents"
    verbose_name = "AI employees and model endpoints"

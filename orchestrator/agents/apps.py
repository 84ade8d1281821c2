from __future__ import annotations

from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "orchestrator.agents"
    label = "agents"
    verbose_name = "AI employees and model endpoints"

    def ready(self) -> None:
        from orchestrator.agents.metrics import breaker_state_collect
        from orchestrator.metrics import state_collector_register

        # Each model endpoint's breaker state, read at each scrape (docs/observability.md).
        state_collector_register("model-breakers", breaker_state_collect)

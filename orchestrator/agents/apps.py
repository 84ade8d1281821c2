from __future__ import annotations

from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "orchestrator.agents"
    label = "agents"
    verbose_name = "AI employees and model endpoints"

    def ready(self) -> None:
        from instructions.usage import register as instruction_usage_register
        from orchestrator.agents.instruction_usage import employee_instruction_uses
        from orchestrator.agents.metrics import breaker_state_collect
        from orchestrator.metrics import state_collector_register

        # Each model endpoint's breaker state, read at each scrape (docs/observability.md).
        state_collector_register("model-breakers", breaker_state_collect)
        # Where-used of an instruction: employees whose system prompt references it.
        instruction_usage_register(employee_instruction_uses)

from __future__ import annotations

from django.apps import AppConfig

from orchestrator import guard


class OrchestratorConfig(AppConfig):
    name = "orchestrator"
    verbose_name = "Loopwright"

    def ready(self) -> None:
        # The outbound policy and the secret rule of this process come from the settings.
        guard.apply()

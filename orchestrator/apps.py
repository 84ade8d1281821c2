from __future__ import annotations

from django.apps import AppConfig


class OrchestratorConfig(AppConfig):
    name = "orchestrator"
    verbose_name = "Loopwright"

    def ready(self) -> None:
        # The outbound policy and the secret rule of this process come from the settings.
        from orchestrator import guard

        guard.apply()

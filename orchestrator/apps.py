from __future__ import annotations

from celery.signals import worker_ready
from django.apps import AppConfig

from orchestrator import guard, metrics
from runtime.observers import runtime_observer_register


class OrchestratorConfig(AppConfig):
    name = "orchestrator"
    verbose_name = "Loopwright"

    def ready(self) -> None:
        # The outbound policy and the secret rule of this process come from the settings.
        guard.apply()
        # Model and tool calls of the runtime become Prometheus metrics (docs/observability.md).
        runtime_observer_register(metrics.PrometheusObserver())
        worker_ready.connect(metrics.worker_port_serve, weak=False)

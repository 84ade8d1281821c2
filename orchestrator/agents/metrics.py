"""Each model endpoint's breaker state at scrape time, as a Prometheus gauge
(docs/observability.md): one read of the endpoints' names, one read of the shared breaker store
(Redis or the database) per endpoint; registered in ``AgentsConfig.ready``."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from orchestrator.agents.clients import breaker_default
from orchestrator.agents.models import ModelEndpoint
from runtime.breaker import BreakerState
from runtime.model_config import EndpointConfig


def breaker_state_collect() -> Iterable[Metric]:
    """``loopwright_model_breaker_state{endpoint, state}``: 1 for the state each endpoint's
    breaker is in, 0 for the others."""
    gauge = GaugeMetricFamily(
        "loopwright_model_breaker_state",
        "The circuit breaker state of each model endpoint (1 for the current state).",
        labels=["endpoint", "state"],
    )
    store = breaker_default().store
    for name in ModelEndpoint.objects.order_by("name").values_list("name", flat=True):
        current = store.read(EndpointConfig(name=name).breaker_key).state
        for state in BreakerState:
            gauge.add_metric([name, state.value], 1.0 if state is current else 0.0)
    return [gauge]

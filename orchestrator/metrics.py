"""The Prometheus metrics of every Loopwright process (docs/observability.md, Metrics).

Counters and histograms are counted where the thing happens (a run's end, a reap, a lost
lease, a model or tool call, a skill execution) and kept in the host's multiprocess folder
(``orchestrator/metrics_store.py``), so a scrape of any one process sees them all. What the
database already knows (runs by status, approvals pending, the queue, breaker states) is read
at scrape time by the collectors the apps register here (:func:`state_collector_register`).

Labels are bounded names only (statuses, reasons, endpoint names, effect tiers): never a run
id, a user or an argument.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from orchestrator.metrics_store import HostCollector, metrics_store_enable

logger = logging.getLogger(__name__)

# The mode must be chosen before the first metric below exists.
metrics_store_enable()

_MODEL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_TOOL_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0)
# Metrics live in this module's registry, never the global one: a scrape reads them from the
# multiprocess folder, which holds every process's values.
_DEFINED = CollectorRegistry(auto_describe=False)

RUNS_ENDED = Counter(
    "loopwright_runs_ended",
    "Runs that reached a terminal status, by status and terminal reason.",
    ["status", "reason"],
    registry=_DEFINED,
)
RUNS_REAPED = Counter(
    "loopwright_runs_reaped",
    "Runs whose lease expired, taken back by the reaper: requeued or failed.",
    ["outcome"],
    registry=_DEFINED,
)
LEASE_LOSSES = Counter(
    "loopwright_lease_losses",
    "Runs a worker stopped driving because its lease was gone (while driving or at heartbeat).",
    ["where"],
    registry=_DEFINED,
)
STEP_SECONDS = Histogram(
    "loopwright_step_duration_seconds",
    "Model steps of runs as the run saw them, by kind and the endpoint that answered.",
    ["kind", "endpoint"],
    buckets=_MODEL_BUCKETS,
    registry=_DEFINED,
)
MODEL_CALL_SECONDS = Histogram(
    "loopwright_model_call_duration_seconds",
    "Calls to one model endpoint (its retries included), by endpoint and outcome.",
    ["endpoint", "outcome"],
    buckets=_MODEL_BUCKETS,
    registry=_DEFINED,
)
MODEL_ERRORS = Counter(
    "loopwright_model_errors",
    "Failed attempts on a model endpoint, by endpoint and error kind.",
    ["endpoint", "kind"],
    registry=_DEFINED,
)
TOOL_CALLS = Counter(
    "loopwright_tool_calls",
    "Tool calls that ran, by the tool's effect tier and outcome.",
    ["tier", "outcome"],
    registry=_DEFINED,
)
TOOL_CALL_SECONDS = Histogram(
    "loopwright_tool_call_duration_seconds",
    "How long tool calls ran, by the tool's effect tier.",
    ["tier"],
    buckets=_TOOL_BUCKETS,
    registry=_DEFINED,
)
SKILL_EXECUTIONS = Counter(
    "loopwright_skill_executions",
    "Skill executions that finished, by outcome (their final status).",
    ["outcome"],
    registry=_DEFINED,
)
SEMANTIC_CACHE_LOOKUPS = Counter(
    "loopwright_semantic_cache_lookups",
    "Semantic cache lookups of runs' read-only model calls, by outcome (hit, miss, error).",
    ["outcome"],
    registry=_DEFINED,
)


class PrometheusObserver:
    """The runtime's observer (``runtime/observers.py``): model and tool calls as metrics."""

    def model_call(self, *, endpoint: str, seconds: float, error: str) -> None:
        MODEL_CALL_SECONDS.labels(endpoint=endpoint, outcome=error or "ok").observe(seconds)

    def model_error(self, *, endpoint: str, kind: str) -> None:
        MODEL_ERRORS.labels(endpoint=endpoint, kind=kind).inc()

    def tool_call(self, *, effect: str, outcome: str, seconds: float) -> None:
        TOOL_CALLS.labels(tier=effect, outcome=outcome).inc()
        TOOL_CALL_SECONDS.labels(tier=effect).observe(seconds)


#: Reads of the database's state at scrape time, by name (one or two cheap queries each).
StateCollector = Callable[[], Iterable[Metric]]
_state_collectors: dict[str, StateCollector] = {}


def state_collector_register(name: str, collect: StateCollector) -> None:
    """Install ``collect`` (an app's ``ready``); it runs at every scrape of the web process."""
    _state_collectors[name] = collect


class _StateCollector(Collector):
    def collect(self) -> Iterable[Metric]:
        found: list[Metric] = []
        for name, collect in list(_state_collectors.items()):
            try:
                found.extend(collect())
            except Exception:  # one failing read must not cost the scrape the others
                logger.exception("metrics: the %s collector failed", name)
        return found


def scrape_registry(*, with_state: bool) -> CollectorRegistry:
    """A registry for one scrape: every process's counters on this host, and, ``with_state``,
    the database's state (the web process; a worker's own port leaves it out)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HostCollector(metrics_store_enable()))
    if with_state:
        registry.register(_StateCollector())
    return registry


def worker_port_serve(**_: Any) -> None:
    """A worker's own ``/metrics`` (``LOOPWRIGHT_METRICS_WORKER_PORT``, off at 0): this
    host's counters, without the database's state; connected to Celery's ``worker_ready``."""
    port = int(settings.METRICS_WORKER_PORT)
    if port:
        addr = str(settings.METRICS_WORKER_ADDR)
        start_http_server(port, addr=addr, registry=scrape_registry(with_state=False))
        logger.info("metrics: serving this host's counters on %s:%d", addr, port)


__all__ = [
    "LEASE_LOSSES",
    "MODEL_CALL_SECONDS",
    "MODEL_ERRORS",
    "RUNS_ENDED",
    "RUNS_REAPED",
    "SKILL_EXECUTIONS",
    "STEP_SECONDS",
    "TOOL_CALLS",
    "TOOL_CALL_SECONDS",
    "PrometheusObserver",
    "StateCollector",
    "scrape_registry",
    "state_collector_register",
    "worker_port_serve",
]

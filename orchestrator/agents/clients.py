"""From stored configuration to runtime objects: endpoint configs, breakers, model clients.

The runtime (``runtime``) never touches the ORM during a call: an invocation turns
the employee's rows into plain :class:`EndpointConfig` values here, once, before it starts.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings

from orchestrator.agents.breaker_store import DatabaseBreakerStore, Offload
from orchestrator.agents.models import Employee, ModelEndpoint
from orchestrator.errors import NotFound
from runtime.breaker import (
    CLOSED_CACHE_SECONDS,
    BreakerStore,
    CircuitBreaker,
    RedisBreakerStore,
)
from runtime.loop import LoopSettings
from runtime.model_client import client_for_endpoint
from runtime.model_config import EndpointConfig, ModelParams
from runtime.streaming import STREAM_MODES, StreamMode, TextCallback
from runtime.types import ModelClient


def _single_config(endpoint: ModelEndpoint, *, model: str, params: ModelParams) -> EndpointConfig:
    return EndpointConfig(
        name=endpoint.name,
        provider="scripted" if endpoint.provider == "scripted" else "openai",
        base_url=endpoint.base_url,
        model=model,
        api_key_env=endpoint.api_key_env,
        params=params,
        context_window=endpoint.context_window,
        input_price=float(endpoint.input_price_per_token),
        output_price=float(endpoint.output_price_per_token),
        max_retries=endpoint.max_retries,
        timeout_seconds=endpoint.timeout_seconds,
        circuit_cooldown_seconds=float(endpoint.circuit_cooldown_seconds),
        script=endpoint.script or "demo",
    )


def endpoint_config_from_model(
    endpoint: ModelEndpoint, *, params_override: ModelParams | None = None
) -> EndpointConfig:
    """The endpoint with its failover chain resolved, as a plain value.

    Failover hops inherit the primary's parameters, with the hop's own overrides on
    top; their model is the hop's override or the target endpoint's model. ``params_override``
    (an employee's parameters) applies to every hop.
    """
    params = ModelParams.model_validate(endpoint.params).merged(params_override)
    failover = tuple(
        _single_config(
            route.target,
            model=route.model or route.target.model,
            params=params.merged(ModelParams.model_validate(route.params)).merged(params_override),
        )
        for route in endpoint.failover_routes.select_related("target").order_by("priority")
    )
    primary = _single_config(endpoint, model=endpoint.model, params=params)
    return dataclasses.replace(primary, failover=failover)


def employee_get(*, username: str) -> Employee:
    employee = Employee.objects.select_related("endpoint").filter(username=username).first()
    if employee is None:
        raise NotFound(f"No AI employee named {username}.")
    return employee


def employee_endpoint_config(employee: Employee) -> EndpointConfig:
    return endpoint_config_from_model(
        employee.endpoint, params_override=ModelParams.model_validate(employee.params)
    )


def stream_mode_of(employee: Employee) -> StreamMode:
    for mode in STREAM_MODES:
        if mode == employee.stream_tool_call_check:
            return mode
    return "auto"


def loop_settings_for_employee(employee: Employee) -> LoopSettings:
    """The tool loop's settings from the employee's row: limits, the endpoint's context window,
    and ``streaming`` (every model request of the loop streams; ``stream_tool_call_check`` is
    the client's detection mode, :func:`stream_mode_of`)."""
    return LoopSettings(
        max_steps=employee.max_steps,
        tool_concurrency=employee.tool_concurrency,
        tool_timeout_seconds=employee.tool_timeout_seconds,
        max_tool_output_chars=employee.max_tool_output_length,
        context_window_tokens=employee.endpoint.context_window,
        stream=employee.streaming,
    )


@functools.cache
def breaker_default() -> CircuitBreaker:
    """The process-wide breaker: Redis when ``REDIS_URL`` is set, else the database."""
    store: BreakerStore
    if settings.REDIS_URL:
        store = RedisBreakerStore.from_url(settings.REDIS_URL)
    else:
        store = DatabaseBreakerStore()
    return CircuitBreaker(store, closed_cache_seconds=CLOSED_CACHE_SECONDS)


def breaker_offloaded(offload: Offload) -> CircuitBreaker:
    """:func:`breaker_default`, with a database store's reads and writes run by ``offload`` (a
    caller's own database threads, which keep their connections); a Redis store is the same."""
    if settings.REDIS_URL:
        return breaker_default()
    return CircuitBreaker(DatabaseBreakerStore(offload), closed_cache_seconds=CLOSED_CACHE_SECONDS)


def route_target_config(endpoint: ModelEndpoint, employee: Employee) -> EndpointConfig:
    """An alias rule's target as one hop: its own model and parameters under the employee's
    (its own failover routes are not followed: the rule's targets are the chain)."""
    params = ModelParams.model_validate(endpoint.params).merged(
        ModelParams.model_validate(employee.params)
    )
    return _single_config(endpoint, model=endpoint.model, params=params)


def model_client_for_employee(
    employee: Employee,
    *,
    on_text: TextCallback | None = None,
    breaker: CircuitBreaker | None = None,
    config: EndpointConfig | None = None,
    **options: Any,
) -> ModelClient:
    """A fresh client for ``employee`` with its streaming settings, over its endpoint chain or
    ``config`` (an alias route's); reads the ORM, call it sync."""
    return client_for_endpoint(
        config or employee_endpoint_config(employee),
        breaker=breaker or breaker_default(),
        stream_mode=stream_mode_of(employee),
        stream_retry_mode="full" if employee.stream_retry_mode == "full" else "off",
        on_text=on_text,
        **options,
    )


def model_client_for(username: str, **options: Any) -> ModelClient:
    """The client for the employee named ``username`` (reads the ORM; call it sync)."""
    return model_client_for_employee(employee_get(username=username), **options)


async def amodel_client_for(username: str, **options: Any) -> ModelClient:
    """:func:`model_client_for` from async code: fits the tool loop's client factory."""
    return await sync_to_async(functools.partial(model_client_for, username, **options))()

"""From stored employees and endpoints to runtime clients (and a real call through them)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.test import override_settings

from orchestrator.agents import services
from orchestrator.agents.breaker_store import DatabaseBreakerStore
from orchestrator.agents.clients import (
    amodel_client_for,
    breaker_default,
    employee_endpoint_config,
    employee_get,
    endpoint_config_from_model,
    model_client_for_employee,
)
from orchestrator.agents.models import Employee, ModelEndpoint
from orchestrator.errors import NotFound
from runtime.breaker import (
    BreakerState,
    CircuitBreaker,
    RedisBreakerStore,
    Verdict,
)
from runtime.model_client import OpenAICompatibleClient
from runtime.model_config import ModelParams
from runtime.scripted import ScriptedModelClient
from runtime.types import ChatRequest
from tests.support.model_server import Completion, Error, ModelServer

pytestmark = pytest.mark.django_db


def http_endpoint(
    name: str, url: str = "https://example.test/v1", **fields: object
) -> ModelEndpoint:
    defaults: dict[str, object] = {"base_url": url, "model": f"{name}-model"}
    return services.model_endpoint_create(name=name, **{**defaults, **fields})


def test_the_config_carries_every_setting_and_resolves_failover_in_order():
    backup_1 = http_endpoint("backup-1", api_key_env="LOOPWRIGHT_SECRET_B1_KEY", timeout_seconds=5)
    backup_2 = http_endpoint("backup-2", params={"temperature": 1.5})
    primary = http_endpoint(
        "primary",
        api_key_env="LOOPWRIGHT_SECRET_PRIMARY_KEY",
        params={"temperature": 0.7, "topP": 0.9},
        input_price_per_token=Decimal("0.000002"),
        output_price_per_token=Decimal("0.000008"),
        max_retries=2,
        circuit_cooldown_seconds=30,
        context_window=32_000,
        failover=[
            services.FailoverSpec(target=backup_2),
            services.FailoverSpec(
                target=backup_1, model="small", params=ModelParams.model_validate({"topP": 0.5})
            ),
        ],
    )

    config = endpoint_config_from_model(primary)

    assert (config.name, config.model, config.api_key_env) == (
        "primary",
        "primary-model",
        "LOOPWRIGHT_SECRET_PRIMARY_KEY",
    )
    assert (config.max_retries, config.circuit_cooldown_seconds) == (2, 30)
    assert (config.input_price, config.output_price) == (0.000002, 0.000008)
    assert config.context_window == 32_000
    assert [hop.name for hop in config.failover] == ["backup-2", "backup-1"]
    second, first = config.failover
    # A hop inherits the primary's parameters, plus its own overrides.
    assert (second.model, second.params.temperature, second.params.top_p) == (
        "backup-2-model",
        0.7,
        0.9,
    )
    assert (first.model, first.params.top_p, first.api_key_env) == (
        "small",
        0.5,
        "LOOPWRIGHT_SECRET_B1_KEY",
    )
    assert first.timeout_seconds == 5
    assert first.failover == ()


def test_employee_parameters_override_the_endpoint_on_every_hop():
    backup = http_endpoint("backup")
    primary = http_endpoint(
        "primary", params={"temperature": 0.7}, failover=[services.FailoverSpec(target=backup)]
    )
    employee = services.employee_create(
        username="verifier", endpoint=primary, params=ModelParams(temperature=0.0)
    )

    config = employee_endpoint_config(employee)

    assert config.params.temperature == 0.0
    assert config.failover[0].params.temperature == 0.0


def test_the_client_follows_the_provider_and_the_employee_stream_mode():
    offline = services.model_endpoint_create(name="offline", provider="scripted")
    http = http_endpoint("primary")
    scripted = services.employee_create(username="lead", endpoint=offline)
    streaming = services.employee_create(
        username="maker", endpoint=http, streaming=True, stream_tool_call_check="firstContent"
    )
    breaker = CircuitBreaker(DatabaseBreakerStore())

    scripted_client = model_client_for_employee(scripted, breaker=breaker)
    http_client = model_client_for_employee(streaming, breaker=breaker)

    assert isinstance(scripted_client, ScriptedModelClient)
    assert isinstance(http_client, OpenAICompatibleClient)
    assert http_client.stream_mode == "firstContent"
    assert http_client.breaker is breaker


@pytest.mark.django_db(transaction=True)
def test_a_stored_employee_calls_its_endpoint_and_fails_over(
    make_model_server, monkeypatch: pytest.MonkeyPatch
):
    primary_server: ModelServer = make_model_server()
    backup_server: ModelServer = make_model_server()
    primary_server.always(Error(500))
    backup_server.queue(Completion(content="answered by the backup", usage=(1000, 100)))
    monkeypatch.setenv("LOOPWRIGHT_SECRET_BACKUP_KEY", "sk-backup")
    backup = http_endpoint(
        "backup",
        url=backup_server.url,
        api_key_env="LOOPWRIGHT_SECRET_BACKUP_KEY",
        input_price_per_token=Decimal("0.001"),
    )
    primary = http_endpoint(
        "primary",
        url=primary_server.url,
        max_retries=0,
        failover=[services.FailoverSpec(target=backup)],
    )
    services.employee_create(username="maker", endpoint=primary)
    employee = employee_get(username="maker")
    model = model_client_for_employee(employee, breaker=CircuitBreaker(DatabaseBreakerStore()))

    response = asyncio.run(
        model.complete(ChatRequest(messages=[{"role": "user", "content": "go"}]))
    )

    assert response.content == "answered by the backup"
    assert response.endpoint == "backup"
    assert response.cost == pytest.approx(1.0)
    assert backup_server.requests[0].headers["authorization"] == "Bearer sk-backup"
    assert primary_server.bodies[0]["model"] == "primary-model"


def test_an_unknown_employee_is_not_found():
    with pytest.raises(NotFound):
        employee_get(username="ghost")
    assert not Employee.objects.exists()


@pytest.mark.parametrize(
    ("url", "store"), [("", DatabaseBreakerStore), ("redis://127.0.0.1:1/0", RedisBreakerStore)]
)
def test_the_default_breaker_shares_state_through_redis_or_the_database(url: str, store: type):
    breaker_default.cache_clear()
    try:
        with override_settings(REDIS_URL=url):
            assert isinstance(breaker_default().store, store)
    finally:
        breaker_default.cache_clear()


@pytest.mark.django_db(transaction=True)
def test_the_async_factory_builds_the_client_from_a_username():
    offline = services.model_endpoint_create(name="offline", provider="scripted")
    services.employee_create(username="lead", endpoint=offline)

    async def plan() -> str:
        model = await amodel_client_for("lead")
        messages = [{"role": "system", "content": "role:leader"}, {"role": "user", "content": "x"}]
        return (await model.complete(ChatRequest(messages=messages))).content

    try:
        assert '"tasks"' in asyncio.run(plan())
    finally:
        asyncio.run(sync_to_async(connections.close_all)())


@pytest.mark.django_db(transaction=True)
def test_the_database_store_can_run_on_the_callers_own_database_threads():
    ran: list[str] = []

    async def offload(fn: Callable[[], Any]) -> Any:
        def on_pool_thread() -> Any:
            try:
                ran.append("pool")
                return fn()
            finally:
                connections.close_all()

        return await asyncio.to_thread(on_pool_thread)

    breaker = CircuitBreaker(DatabaseBreakerStore(offload=offload))

    async def trip() -> Verdict:
        await breaker.record_failure(await breaker.admit("k", probe_lease=60), cooldown=60)
        return (await breaker.admit("k", probe_lease=60)).verdict

    assert asyncio.run(trip()) is Verdict.DENY
    assert breaker.snapshot("k").state is BreakerState.OPEN
    assert ran == ["pool"] * 3

"""docs/reliability.md P6, secrets: no server variable can be named as a connector's key.

From outside with an operator token, ``api_key_env`` naming any variable of the server's own
configuration (every name the product code reads from the environment, found by scanning it,
plus ``PATH``, ``HOME``, ...) is refused with 400 ``/api_key_env`` and the rule; so is every
unprefixed name of this process's environment, on create and on change, and in the admin. A
row that names one anyway (written before the rule, or in the database) fails the model call
with the rule and sends nothing. A prefixed name, and a name on the allow list, work end to end
against the loopback model server.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from django.db import DEFAULT_DB_ALIAS, connections
from django.test import Client

from loops.models import LoopRun, RunStatus
from loops.services.claims import run_claim
from loops.services.runs import run_trigger
from loops.worker.engine import drive_run
from loops.worker.invoker import AgentInvoker
from orchestrator.agents.clients import employee_endpoint_config, employee_get
from orchestrator.agents.models import ModelEndpoint
from orchestrator.agents.services import employee_create
from runtime.model_client import client_for_endpoint
from runtime.secrets import SERVER_VARIABLES, current_secret_rule, parse_secret_rule
from runtime.tools import DirectoryLedger, FileToolConfig, builtin_registry
from runtime.types import ChatRequest, ModelCallFailed
from tests.support.approvals import InlineDriver, approval_pattern, loopback_team
from tests.support.model_server import Completion, ModelServer

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
ENDPOINTS = "/api/v1/model-endpoints"
RULE = "must name a variable starting with LOOPWRIGHT_SECRET_ or listed in LOOPWRIGHT_SECRET_ALLOW"
_READS = re.compile(
    r"""(?:environ\.get|environ\[|getenv|env_bool|env_int|env_float|env\.get)\(?\s*["']([A-Z][A-Z0-9_]+)["']"""
)
ASK = ChatRequest(messages=[{"role": "user", "content": "hi"}])


def server_variables_in_the_code() -> set[str]:
    """Every environment variable the product code reads (settings, sandbox, CLI, ...)."""
    found: set[str] = set()
    for package in ("orchestrator", "loops", "skillhub", "harness", "frontend"):
        for path in (ROOT / package).rglob("*.py"):
            found.update(_READS.findall(path.read_text()))
    return found


def test_the_scan_finds_the_settings() -> None:
    names = server_variables_in_the_code()
    assert {"SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL", "EMAIL_HOST_PASSWORD",
            "LOOPWRIGHT_SECRET_PREFIX", "LOOPWRIGHT_SECRET_ALLOW", "LOOPWRIGHT_VAR_DIR"} <= names  # fmt: skip
    assert len(names) >= 40


def endpoint_body(name: str, api_key_env: str, base_url: str = "http://127.0.0.1:9/v1") -> dict:
    return {"name": name, "base_url": base_url, "model": "m", "api_key_env": api_key_env}


@pytest.mark.parametrize(
    "names",
    [
        ["SECRET_KEY", "DATABASE_URL", "PATH", "HOME", "CELERY_BROKER_URL", "REDIS_URL"],
        sorted(server_variables_in_the_code() | SERVER_VARIABLES),
    ],
    ids=["named-in-the-issue", "every-server-variable"],
)
def test_server_variables_are_refused_through_the_api(
    api_client_for: Any, names: list[str]
) -> None:
    operator = api_client_for("operator")
    kept = operator.post(ENDPOINTS, endpoint_body("kept", ""), format="json")
    assert kept.status_code == 201, kept.content
    for name in names:
        for response in (
            operator.post(ENDPOINTS, endpoint_body("leak", name), format="json"),
            operator.patch(f"{ENDPOINTS}/kept", {"api_key_env": name}, format="json"),
        ):
            assert response.status_code == 400, (name, response.content)
            assert response["Content-Type"] == "application/problem+json"
            problem = response.json()
            assert [e["pointer"] for e in problem["errors"]] == ["/api_key_env"], name
            assert RULE in problem["detail"] and name in problem["detail"], problem
    assert list(ModelEndpoint.objects.values_list("name", "api_key_env")) == [("kept", "")]


def test_no_unprefixed_variable_of_this_process_can_be_named() -> None:
    rule = current_secret_rule()
    named = [n for n in os.environ if rule.check(n) is None]
    assert all(n.startswith("LOOPWRIGHT_SECRET_") for n in named), named
    problem = rule.check("SECRET_KEY")
    assert (
        problem
        == f"api_key_env {RULE}; SECRET_KEY is neither (it is one of the server's own variables)"
    )


def test_the_admin_form_refuses_a_server_variable(admin_client: Client) -> None:
    form = {
        "name": "primary", "provider": "openai", "base_url": "http://127.0.0.1:9/v1",
        "model": "m", "api_key_env": "DATABASE_URL", "params": "{}", "context_window": 1000,
        "input_price_per_token": "0", "output_price_per_token": "0", "max_retries": 3,
        "timeout_seconds": 60, "circuit_cooldown_seconds": 60,
        "failover_routes-TOTAL_FORMS": 0, "failover_routes-INITIAL_FORMS": 0,
    }  # fmt: skip
    response = admin_client.post("/admin/agents/modelendpoint/add/", form)
    assert response.status_code == 200  # the form again, with the error
    assert f"{RULE}; DATABASE_URL is neither" in response.content.decode()
    assert not ModelEndpoint.objects.exists()


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    with ModelServer() as server:
        yield server


def call(username: str) -> Any:
    """One model call of the employee, with the client built from its rows as in production
    (without the shared breaker, whose store would need the database from the event loop)."""
    client = client_for_endpoint(employee_endpoint_config(employee_get(username=username)))
    return asyncio.run(client.complete(ASK))


def make_team(operator: Any, server: ModelServer, api_key_env: str) -> Any:
    response = operator.post(
        ENDPOINTS, endpoint_body("p6", api_key_env, base_url=server.url), format="json"
    )
    if response.status_code == 201:
        employee_create(username="p6-maker", endpoint=ModelEndpoint.objects.get(name="p6"))
    return response


def test_a_prefixed_name_works_end_to_end(
    api_client_for: Any, model_server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOPWRIGHT_SECRET_P6_KEY", "sk-p6-allowed")
    response = make_team(api_client_for("operator"), model_server, "LOOPWRIGHT_SECRET_P6_KEY")
    assert response.status_code == 201 and response.json()["api_key_configured"] is True
    model_server.queue(Completion(content="hello"))
    assert call("p6-maker").content == "hello"
    assert model_server.requests[0].headers["authorization"] == "Bearer sk-p6-allowed"


def test_the_allow_list_admits_exactly_its_names(
    api_client_for: Any, model_server: ModelServer, monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:  # fmt: skip
    operator = api_client_for("operator")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-listed")
    assert make_team(operator, model_server, "OPENAI_API_KEY").status_code == 400
    settings.LOOPWRIGHT_SECRETS = parse_secret_rule(None, "OPENAI_API_KEY")
    assert make_team(operator, model_server, "ANTHROPIC_API_KEY").status_code == 400
    assert make_team(operator, model_server, "OPENAI_API_KEY").status_code == 201
    model_server.queue(Completion(content="listed"))
    assert call("p6-maker").content == "listed"
    assert model_server.requests[0].headers["authorization"] == "Bearer sk-listed"


@pytest.mark.parametrize("name", ["SECRET_KEY", "DATABASE_URL", "HOME"])
def test_a_row_naming_a_server_variable_anyway_sends_nothing(
    api_client_for: Any, model_server: ModelServer, name: str
) -> None:
    """Written before the rule existed, or straight into the database."""
    make_team(api_client_for("operator"), model_server, "")
    ModelEndpoint.objects.filter(name="p6").update(api_key_env=name)
    with pytest.raises(ModelCallFailed) as failed:
        call("p6-maker")
    assert f"{RULE}; {name} is neither" in str(failed.value)
    assert "refused before any request" in str(failed.value)
    assert model_server.requests == []
    detail = api_client_for("viewer").get(f"{ENDPOINTS}/p6").json()
    assert detail["api_key_configured"] is False  # a refused name is never even read


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("seeded_profiles")
def test_a_run_whose_endpoint_names_a_server_variable_fails_with_the_rule(
    model_server: ModelServer, tmp_path: Path
) -> None:
    """A real trigger and the production invoker: the run fails naming the rule, and the
    model server receives nothing."""
    loopback_team(model_server.url, "p6")
    ModelEndpoint.objects.update(api_key_env="SECRET_KEY")
    pattern = approval_pattern("p6-secrets")
    run = run_trigger(pattern=pattern, actor="operator", inputs={})
    invoker = AgentInvoker(tools=builtin_registry(FileToolConfig(ledger=DirectoryLedger(tmp_path))))
    [claim] = run_claim(owner="p6-engine", lease_seconds=300, run_id=run.id)
    outer = connections[DEFAULT_DB_ALIAS]

    async def main() -> None:
        connections[DEFAULT_DB_ALIAS] = outer
        await drive_run(InlineDriver(invoker), claim)  # type: ignore[arg-type]

    with mock.patch.dict(os.environ, {"DJANGO_ALLOW_ASYNC_UNSAFE": "true"}):
        asyncio.run(main())
    run = LoopRun.objects.get(pk=run.id)
    assert run.status == RunStatus.FAILED
    assert f"{RULE}; SECRET_KEY is neither" in run.failure_reason
    assert model_server.requests == []

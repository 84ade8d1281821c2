"""Model aliases (docs/model-routing.md): rules route an employee's model calls by pattern, role
and cost ceiling, and fail over when a target's circuit breaker is open. Runs use the
production invoker and models over loopback HTTP; the API is exercised over REST."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from loops.models import LoopStep, RunStatus
from loops.services.runs import run_trigger
from orchestrator.agents.aliases import alias_create
from orchestrator.agents.models import ModelAlias, ModelEndpoint
from orchestrator.agents.routing import AliasRule, pick_rule
from orchestrator.agents.services import employee_create, model_endpoint_create
from tests.support.approvals import (
    LEADER,
    MAKER,
    VERIFIER,
    approval_pattern,
    drive_production,
    http_reply,
    role_of,
)
from tests.support.model_server import Error, ModelServer

pytestmark = [pytest.mark.timeout(180)]

PRICES = {"cheap": (Decimal("1e-6"), Decimal("2e-6")), "pricey": (Decimal("1e-5"), Decimal(0))}


def _rules(*rules: dict[str, object]) -> list[AliasRule]:
    return [AliasRule.model_validate(rule) for rule in rules]


class TestPickRule:
    def test_the_first_matching_rule_wins_and_a_pattern_rule_needs_a_pattern(self) -> None:
        rules = _rules(
            {"patterns": ["nightly-*"], "targets": ["pricey"]},
            {"roles": ["maker"], "targets": ["cheap"]},
            {"targets": ["pricey", "cheap"]},
        )
        assert pick_rule(rules, pattern="nightly-1", role="maker", prices=PRICES) == (0, ["pricey"])
        assert pick_rule(rules, pattern="day", role="maker", prices=PRICES) == (1, ["cheap"])
        assert pick_rule(rules, pattern="", role="chat", prices=PRICES) == (2, ["pricey", "cheap"])

    def test_the_ceiling_drops_targets_and_a_rule_left_with_none_does_not_match(self) -> None:
        rules = _rules(
            {"max_price_per_million_tokens": 5, "targets": ["pricey"]},
            {"max_price_per_million_tokens": 5, "targets": ["pricey", "cheap", "gone"]},
        )
        # pricey costs 10 per million input tokens; "gone" names no endpoint (deleted meanwhile).
        assert pick_rule(rules, pattern="p", role="leader", prices=PRICES) == (1, ["cheap"])
        assert pick_rule(rules[:1], pattern="p", role="leader", prices=PRICES) is None


@pytest.fixture
def servers() -> Iterator[dict[str, ModelServer]]:
    with ModelServer() as own, ModelServer() as cheap, ModelServer() as pricey:
        for server in (own, cheap, pricey):
            server.always(http_reply)
        yield {"own": own, "cheap": cheap, "pricey": pricey}
        for server in (own, cheap, pricey):
            server.check()


def _endpoint(name: str, server: ModelServer, price: str = "0") -> ModelEndpoint:
    return model_endpoint_create(
        name=name, provider="openai", base_url=server.url, model=f"{name}-model", max_retries=0,
        timeout_seconds=60, input_price_per_token=Decimal(price), circuit_cooldown_seconds=600,
    )  # fmt: skip


def _employees(own: ModelEndpoint, alias_name: str) -> None:
    routed = ModelAlias.objects.get(name=alias_name)
    for username in (LEADER, MAKER, VERIFIER):
        employee_create(username=username, endpoint=own, tools=["list"], model_alias=routed)


def _roles(server: ModelServer) -> list[str]:
    return [role_of(body["messages"]) for body in server.bodies]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("seeded_profiles")
def test_a_run_routes_each_role_by_the_alias_rules(servers: dict[str, ModelServer]) -> None:
    own = _endpoint("own", servers["own"])
    _endpoint("cheap", servers["cheap"], price="0.000001")
    _endpoint("pricey", servers["pricey"], price="0.00001")
    alias_create(
        name="default-reasoning",
        actor="test",
        rules=[
            {"patterns": ["nightly-*"], "targets": ["pricey"]},
            {"roles": ["maker"], "max_price_per_million_tokens": 5, "targets": ["pricey", "cheap"]},
        ],
    )
    _employees(own, "default-reasoning")
    inputs = {"label": "route", "rounds": [[["list", {"path": "."}]]]}
    run = run_trigger(pattern=approval_pattern("day-route"), actor="alice", inputs=inputs)

    assert drive_production(run.id) == RunStatus.SUCCEEDED
    # The maker's rule skips "pricey" (10 per million) for "cheap"; no rule matches the leader
    # and the verifier in pattern "day-route": the employees' own endpoint.
    assert set(_roles(servers["cheap"])) == {"maker"}
    assert set(_roles(servers["own"])) == {"leader", "verifier"}
    assert servers["pricey"].bodies == []
    maker_steps = LoopStep.objects.filter(run_id=run.id, kind="model", invocation="maker:0")
    assert {step.response["endpoint"] for step in maker_steps} == {"cheap"}
    assert {step.request["route"] for step in maker_steps} == {
        "alias default-reasoning rule 2: cheap"
    }

    # The same employees in a pattern the first rule names: every role goes to "pricey".
    run = run_trigger(pattern=approval_pattern("nightly-route"), actor="alice", inputs=inputs)
    assert drive_production(run.id) == RunStatus.SUCCEEDED
    assert set(_roles(servers["pricey"])) == {"leader", "maker", "verifier"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("seeded_profiles")
def test_calls_fail_over_while_the_first_targets_breaker_is_open(
    servers: dict[str, ModelServer],
) -> None:
    down, backup = servers["pricey"], servers["cheap"]
    down.always(Error(503, {"error": {"message": "overloaded"}}))
    own = _endpoint("own", servers["own"])
    _endpoint("down", down)
    _endpoint("backup", backup)
    alias_create(name="resilient", actor="test", rules=[{"targets": ["down", "backup"]}])
    _employees(own, "resilient")
    inputs = {"label": "failover", "rounds": [[["list", {"path": "."}]]]}
    run = run_trigger(pattern=approval_pattern("failover"), actor="alice", inputs=inputs)

    assert drive_production(run.id) == RunStatus.SUCCEEDED
    # One failed request opened "down"'s breaker (no retries); every later call went straight
    # to "backup" without trying it.
    assert len(down.bodies) == 1
    assert set(_roles(backup)) == {"leader", "maker", "verifier"}
    assert servers["own"].bodies == []
    endpoints = set(
        LoopStep.objects.filter(run_id=run.id, kind="model").values_list(
            "response__endpoint", flat=True
        )
    )
    assert endpoints == {"backup"}


@pytest.fixture
def admin_api(api_client_for: Callable[[str], APIClient]) -> APIClient:
    return api_client_for("admin")


@pytest.mark.django_db
class TestModelAliasApi:
    def test_create_route_an_employee_and_refuse_what_would_dangle(
        self, admin_api: APIClient
    ) -> None:
        for name in ("a", "b"):
            body = {"name": name, "provider": "scripted", "script": "demo"}
            assert admin_api.post("/api/v1/model-endpoints", body, format="json").status_code == 201
        rules = [{"roles": ["maker", "chat"], "targets": ["b", "a"]}]
        made = admin_api.post(
            "/api/v1/model-aliases", {"name": "fast", "rules": rules}, format="json"
        )
        assert made.status_code == 201, made.content
        assert made.json()["rules"][0]["max_price_per_million_tokens"] is None
        employee = {"username": "router", "endpoint": "a", "model_alias": "fast"}
        assert admin_api.post("/api/v1/employees", employee, format="json").status_code == 201
        assert admin_api.get("/api/v1/model-aliases/fast").json()["employees"] == ["router"]

        gone = admin_api.delete("/api/v1/model-endpoints/b")
        assert gone.status_code == 409 and "fast" in gone.json()["detail"]
        used = admin_api.delete("/api/v1/model-aliases/fast")
        assert used.status_code == 409 and "router" in used.json()["detail"]
        patched = admin_api.patch("/api/v1/employees/router", {"model_alias": None}, format="json")
        assert patched.status_code == 200 and patched.json()["model_alias"] is None
        assert admin_api.delete("/api/v1/model-aliases/fast").status_code == 204

    @pytest.mark.parametrize(
        ("rules", "pointer"),
        [
            ([{"targets": ["nowhere"]}], "/rules/0/targets/0"),
            ([{"roles": ["boss"], "targets": ["a"]}], "/rules/0/roles/0"),
            ([{"targets": []}], "/rules/0/targets"),
            ([{"targets": ["a"], "max_price_per_million_tokens": -1}], None),
            ([{"targets": ["a"], "priority": 1}], "/rules/0/priority"),
            ({"targets": ["a"]}, "/rules"),
        ],
    )
    def test_bad_rules_are_a_400_pointing_into_them(
        self, admin_api: APIClient, rules: object, pointer: str | None
    ) -> None:
        body = {"name": "a", "provider": "scripted", "script": "demo"}
        admin_api.post("/api/v1/model-endpoints", body, format="json")
        answer = admin_api.post(
            "/api/v1/model-aliases", {"name": "bad", "rules": rules}, format="json"
        )
        assert answer.status_code == 400, answer.content
        assert answer["Content-Type"].startswith("application/problem+json")
        pointers = [error["pointer"] for error in answer.json()["errors"]]
        assert pointer is None or pointer in pointers, pointers
        assert all(p.startswith("/rules") for p in pointers)

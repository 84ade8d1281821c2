"""End to end: a pattern's opt-in semantic cache (docs/semantic-cache.md).

A pattern is created through the REST API with ``semanticCache`` on; two runs with the same
goal are triggered through the API and driven in this process by the real engine with the
production invoker against the scripted model on loopback HTTP and the loopback embedding
server. The second run's leader and verifier (read tools only) are answered from the cache
without a model request, their steps say so; the maker (offered ``write``) reaches the model
both times. An embedding server that fails leaves the calls to the model (fail open).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from loops.cache_models import SemanticCacheEntry
from loops.models import LoopPattern
from loops.services.semantic_cache import semantic_cache_lookup, semantic_cache_store
from orchestrator.accounts.services import user_ensure
from orchestrator.agents.services import employee_create, model_endpoint_create
from orchestrator.metrics import SEMANTIC_CACHE_LOOKUPS
from tests.conftest import PERSONAS
from tests.support.approvals import LEADER, MAKER, VERIFIER, drive_production, role_of
from tests.support.embedding_server import EmbeddingServer, embedding_server
from tests.support.model_server import ModelServer

__all__ = ["embedding_server"]

CACHE = {
    "enabled": True,
    "threshold": 0.95,
    "ttlSeconds": 600,
    "embeddingEndpoint": "cache-embed",
    "embeddingModel": "bow",
}
PATTERN = {
    "key": "cached",
    "goal_template": "Approvals test {{ inputs.get('label', '') }}",
    "leader_username": LEADER,
    "maker_usernames": [MAKER],
    "verifier_username": VERIFIER,
}


@pytest.fixture
def operator(api_client_for: Callable[[str], APIClient]) -> APIClient:
    return api_client_for("operator")


@pytest.fixture
def team(role_model: ModelServer, embedding_server: EmbeddingServer) -> None:
    chat = model_endpoint_create(
        name="cache-chat", provider="openai", base_url=role_model.url, model="cache-script",
        max_retries=0, timeout_seconds=60,
    )  # fmt: skip
    model_endpoint_create(
        name="cache-embed", provider="openai", base_url=embedding_server.url, model="bow"
    )
    employee_create(username=LEADER, endpoint=chat, tools=["read", "list"])
    employee_create(username=MAKER, endpoint=chat, tools=["read", "write"])
    employee_create(username=VERIFIER, endpoint=chat, tools=["read"])


def run_once(operator: APIClient, role_model: ModelServer) -> tuple[str, list[str]]:
    """Trigger a run through the API, drive it; its id and the roles that reached the model."""
    before = len(role_model.bodies)
    body = {"inputs": {"label": "the same goal", "rounds": []}}
    response = operator.post("/api/v1/patterns/cached/trigger", body, format="json")
    assert response.status_code == 201, response.content
    run_id = response.json()["id"]
    assert drive_production(uuid.UUID(run_id)) == "succeeded"
    return run_id, [role_of(b["messages"]) for b in role_model.bodies[before:]]


def model_steps(operator: APIClient, run_id: str) -> dict[str, list[dict[str, Any]]]:
    steps = operator.get(f"/api/v1/runs/{run_id}/steps?limit=100").json()["results"]
    found: dict[str, list[dict[str, Any]]] = {}
    for step in steps:
        if step["kind"] == "model":
            found.setdefault(step["role"], []).append(step["response"])
    return found


def hits() -> float:
    return float(SEMANTIC_CACHE_LOOKUPS.labels(outcome="hit")._value.get())


@pytest.mark.django_db
@pytest.mark.usefixtures("team")
@pytest.mark.timeout(120)
def test_read_only_roles_are_answered_from_the_cache_and_writers_never(
    operator: APIClient, role_model: ModelServer, embedding_server: EmbeddingServer
) -> None:
    created = operator.post(
        "/api/v1/patterns", {**PATTERN, "policy": {"semanticCache": CACHE}}, format="json"
    )
    assert created.status_code == 201, created.content
    assert created.json()["policy"]["semanticCache"]["enabled"] is True
    counted = hits()

    first, roles = run_once(operator, role_model)
    assert sorted(roles) == ["leader", "maker", "verifier"]
    assert not any(r.get("cached") for rs in model_steps(operator, first).values() for r in rs)
    assert SemanticCacheEntry.objects.count() == 2  # the leader's and the verifier's answers

    second, roles = run_once(operator, role_model)
    assert roles == ["maker"]  # the writer reaches the model again; the readers do not
    steps = model_steps(operator, second)
    for role in ("leader", "verifier"):
        [answer] = steps[role]
        assert answer["cached"] is True
        entry = SemanticCacheEntry.objects.get(pk=answer["cache_entry"])
        assert entry.hits == 1 and entry.response["message"] == answer["message"]
    assert not any(r.get("cached") for r in steps["maker"])
    page = Client()
    page.force_login(user_ensure(username="viewer", roles=PERSONAS["viewer"]))
    assert page.get(f"/runs/{second}").content.count(b'class="step-tier step-cached"') == 2
    assert hits() - counted == 2
    # Nothing of the maker's (offered a write) was looked up: two lookups per run.
    assert len(embedding_server.requests) == 4

    # The embedding endpoint fails: the calls go to the model, the run is not harmed.
    embedding_server.fail_next = 100
    _, roles = run_once(operator, role_model)
    assert sorted(roles) == ["leader", "maker", "verifier"]


@pytest.mark.django_db
@pytest.mark.usefixtures("team")
@pytest.mark.parametrize(
    ("cache", "pointer"),
    [
        ({**CACHE, "embeddingEndpoint": "nope"}, "/policy/semanticCache/embeddingEndpoint"),
        ({**CACHE, "embeddingEndpoint": ""}, "/policy/semanticCache/embeddingEndpoint"),
        ({**CACHE, "embeddingModel": ""}, "/policy/semanticCache/embeddingModel"),
        ({**CACHE, "threshold": 0.3}, "/policy/semanticCache/threshold"),
        ({**CACHE, "ttlSeconds": 0}, "/policy/semanticCache/ttlSeconds"),
        ({**CACHE, "size": 3}, "/policy/semanticCache/size"),
    ],
)
def test_an_invalid_semantic_cache_is_a_400_naming_its_pointer(
    operator: APIClient, cache: dict[str, Any], pointer: str
) -> None:
    response = operator.post(
        "/api/v1/patterns", {**PATTERN, "policy": {"semanticCache": cache}}, format="json"
    )
    assert response.status_code == 400, response.content
    assert [e["pointer"] for e in response.json()["errors"]] == [pointer]
    disabled = {"semanticCache": {**cache, "enabled": False}}
    if pointer.endswith(("Endpoint", "Model")):  # only an enabled cache needs them
        created = operator.post("/api/v1/patterns", {**PATTERN, "policy": disabled}, format="json")
        assert created.status_code == 201, created.content


@pytest.mark.django_db
@pytest.mark.usefixtures("team")
def test_an_expired_entry_is_never_returned_and_is_pruned(operator: APIClient) -> None:
    assert operator.post("/api/v1/patterns", PATTERN, format="json").status_code == 201
    pattern_id = LoopPattern.objects.get(key="cached").pk
    then = timezone.now() - timedelta(hours=2)
    stored = {"message": {"role": "assistant", "content": "old"}}
    old = semantic_cache_store(
        pattern_id=pattern_id, key="k", vector=[1.0, 0.0], response=stored, ttl_seconds=60,
        now=then,
    )  # fmt: skip
    found = semantic_cache_lookup(pattern_id=pattern_id, key="k", vector=[1.0, 0.0], threshold=0.9)
    assert found is None
    live = semantic_cache_store(
        pattern_id=pattern_id, key="k", vector=[1.0, 0.1], response=stored, ttl_seconds=60
    )
    assert not SemanticCacheEntry.objects.filter(pk=old).exists()
    hit = semantic_cache_lookup(pattern_id=pattern_id, key="k", vector=[1.0, 0.0], threshold=0.9)
    assert hit is not None and hit.entry_id == live and hit.similarity > 0.99
    assert (
        semantic_cache_lookup(pattern_id=pattern_id, key="other", vector=[1, 0], threshold=0.5)
        is None
    )

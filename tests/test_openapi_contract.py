"""The API contract as a client generator reads it (issue 26): a typed client generated from the
schema a live server serves, with ``openapi-python-client``, parses real 4xx answers into its
``Problem`` model; every operation is tagged by its resource and declares the problem answers
it can give (and no others); 401s say what is wrong with the credentials."""

from __future__ import annotations

import gc
import importlib
import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx2
import jsonschema
import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from orchestrator.accounts.models import ApiToken
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import (
    TOKEN_MALFORMED,
    TOKEN_REFUSED,
    api_token_create,
    user_ensure,
)
from orchestrator.errors import NO_CREDENTIALS
from orchestrator.openapi import CONFLICTS, TAGS
from tests.support.asgi_server import uvicorn_thread

PROBLEM = "application/problem+json"
_GENERATOR = Path(sys.executable).parent / "openapi-python-client"
_PACKAGE = "lw_generated_client"


@pytest.fixture(scope="module")
def live(django_db_blocker: Any) -> Iterator[str]:
    """The real ASGI app on loopback for this module; requests close their DB connections."""
    from django.db import connections

    from orchestrator.asgi import application

    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(connections["default"].settings_dict, "CONN_MAX_AGE", 0)
        with uvicorn_thread(application) as url:
            yield url
    gc.unfreeze()  # the app's lifespan froze this (test) process's heap: give it back


@pytest.fixture(scope="module")
def schema(live: str, django_db_blocker: Any) -> dict[str, Any]:
    with django_db_blocker.unblock():
        response = httpx2.get(f"{live}/api/schema/", params={"format": "json"})
    assert response.status_code == 200, response.text[:300]
    served: dict[str, Any] = response.json()
    return served


@pytest.fixture(scope="module")
def generated(
    schema: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ModuleType]:
    """The client ``openapi-python-client`` generates from the served schema, imported."""
    root = tmp_path_factory.mktemp("client")
    (root / "schema.json").write_text(json.dumps(schema))
    (root / "config.yaml").write_text("post_hooks: []\n")  # no formatter run on the output
    done = subprocess.run(
        [str(_GENERATOR), "generate", "--path", str(root / "schema.json"), "--meta", "none",
         "--output-path", str(root / _PACKAGE), "--config", str(root / "config.yaml")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and "Warning" not in done.stdout, done.stdout + done.stderr
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module(_PACKAGE)
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n.split(".")[0] == _PACKAGE]:
            del sys.modules[name]


def _operations(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            yield path, method, operation


@pytest.mark.django_db(transaction=True)
def test_the_generated_client_parses_real_problems_into_its_problem_model(
    generated: ModuleType, schema: dict[str, Any], live: str
) -> None:
    decide = importlib.import_module(f"{_PACKAGE}.api.approvals.approvals_decide_create")
    runs_list = importlib.import_module(f"{_PACKAGE}.api.runs.runs_list")
    models = importlib.import_module(f"{_PACKAGE}.models")
    user = user_ensure(username="contract-operator", roles=[Role.OPERATOR])
    token = api_token_create(user=user)
    body = models.DecideRequest(decision=models.DecideDecisionEnum.APPROVE)
    missing = uuid.uuid4()
    with (
        generated.AuthenticatedClient(base_url=live, token=token) as client,
        generated.AuthenticatedClient(base_url=live, token="lw_nope_nope") as stranger,
    ):
        answer = decide.sync_detailed(id=missing, client=client, body=body)
        bad = runs_list.sync_detailed(client=client, limit=-1)
        refused = decide.sync_detailed(id=missing, client=stranger, body=body)

    assert answer.status_code == 404 and isinstance(answer.parsed, models.Problem)
    assert (answer.parsed.type_, answer.parsed.status) == ("/problems/not-found", 404)
    assert answer.parsed.instance == f"/api/v1/approvals/{missing}/decide"
    assert bad.status_code == 400 and isinstance(bad.parsed, models.Problem)
    assert [e.pointer for e in bad.parsed.errors] == ["/limit"]
    assert refused.status_code == 401 and isinstance(refused.parsed, models.Problem)
    assert refused.parsed.detail == TOKEN_REFUSED

    # The bodies are true to the component, members the generator does not know included.
    problem = schema["components"]["schemas"]["Problem"]
    for response in (answer, bad, refused):
        assert response.headers["content-type"] == PROBLEM
        jsonschema.validate(json.loads(response.content), problem)


def test_every_operation_is_tagged_by_its_resource(schema: dict[str, Any]) -> None:
    used = set()
    for path, _, operation in _operations(schema):
        resource = path.removeprefix("/api/v1/").split("/")[0]
        assert operation["tags"] == [resource], (path, operation["tags"])
        used.add(resource)
    described = {tag["name"]: tag["description"] for tag in schema["tags"]}
    assert set(described) == used == set(TAGS)
    assert all(described.values())
    assert schema["paths"]["/api/v1/runs/{id}/events"]["get"]["operationId"] == "runs_events_list"


def test_problem_answers_are_declared_where_they_can_happen(schema: dict[str, Any]) -> None:
    for path, _, operation in _operations(schema):
        for status, response in operation["responses"].items():
            if status.startswith("4"):
                content = response["content"][PROBLEM]
                assert content["schema"] == {"$ref": "#/components/schemas/Problem"}, path
    assert {(method, path) for path, method, _ in _operations(schema)} >= CONFLICTS

    def codes(path: str, method: str = "get") -> set[str]:
        return {s for s in schema["paths"][path][method]["responses"] if s.startswith("4")}

    decide = codes("/api/v1/approvals/{id}/decide", "post")
    assert decide == {"400", "401", "403", "404", "409", "413", "415"}
    assert codes("/api/v1/runs/{id}") == {"400", "401", "403", "404"}
    assert codes("/api/v1/skills/listTemplates") == {"401", "403"}  # no input at all
    assert codes("/api/v1/employees/{username}", "put") == {
        "400",
        "401",
        "403",
        "404",
        "413",
        "415",
    }
    assert "405" in codes("/api/v1/harness-profiles/{tag}")  # the tag `compile` is an action
    assert "405" not in codes("/api/v1/skills/{tool_name}")  # no tool name is an action's
    assert codes("/api/v1/events/{event_key}", "post") >= {"401", "403", "409"}
    assert "429" in codes("/api/v1/skills/{tool_name}/test", "post")
    required = schema["components"]["schemas"]["Problem"]["required"]
    assert required == ["type", "title", "status", "detail"]


def test_sub_resources_declare_only_the_parameters_they_read(schema: dict[str, Any]) -> None:
    def query(path: str) -> dict[str, dict[str, Any]]:
        parameters = schema["paths"][path]["get"].get("parameters", [])
        return {p["name"]: p["schema"] for p in parameters if p["in"] == "query"}

    assert set(query("/api/v1/runs/{id}/events")) == {"after_seq", "limit", "offset"}
    assert set(query("/api/v1/runs/{id}/steps")) == {"limit", "offset"}
    assert query("/api/v1/runs/{id}/artifacts") == {}
    assert set(query("/api/v1/skill-executions/{id}/events")) == {"after"}
    assert set(query("/api/v1/skill-executions/{id}/events/stream")) == {"after", "format"}
    steps = query("/api/v1/runs/{id}/steps")
    assert (steps["limit"]["minimum"], steps["limit"]["maximum"]) == (1, 1000)
    after = query("/api/v1/skill-executions/{id}/events")["after"]
    assert (after["minimum"], after["maximum"]) == (0, 2**63 - 1)


@pytest.mark.django_db
def test_a_401_says_what_is_wrong_with_the_credentials(
    api_client_for: Callable[[str], APIClient],
) -> None:
    user = user_ensure(username="contract-viewer", roles=[Role.VIEWER])
    revoked, expired = api_token_create(user=user), api_token_create(user=user)
    ApiToken.objects.filter(prefix=revoked.split("_")[1]).update(revoked_at=timezone.now())
    gone = timezone.now() - timedelta(minutes=1)
    ApiToken.objects.filter(prefix=expired.split("_")[1]).update(expires_at=gone)
    cases = {
        None: NO_CREDENTIALS,
        "Bearer ": TOKEN_MALFORMED,
        "Bearer not-a-token": TOKEN_MALFORMED,
        "Bearer lw_0123456789ab_wrong": TOKEN_REFUSED,
        f"Bearer {revoked}": TOKEN_REFUSED,
        f"Bearer {expired}": TOKEN_REFUSED,
        "Basic dTpw": "The Authorization scheme 'Basic' is not accepted: send "
        "'Authorization: Bearer <API token>'.",
    }
    for header, detail in cases.items():
        client = APIClient()
        if header is not None:
            client.credentials(HTTP_AUTHORIZATION=header)
        response = client.get("/api/v1/runs")
        assert response.status_code == 401, (header, response.content)
        assert response["Content-Type"] == PROBLEM
        assert response["WWW-Authenticate"] == 'Bearer realm="loopwright"'
        assert response.json()["detail"] == detail, header
    assert api_client_for("viewer").get("/api/v1/runs").status_code == 200

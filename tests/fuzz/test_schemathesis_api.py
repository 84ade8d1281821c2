"""Schemathesis against the OpenAPI schema Loopwright serves (``/api/schema/``): every operation,
every built-in check, with an admin's token, in process through the WSGI application on the
test database (SQLite or PostgreSQL, whichever the suite runs on).

Two forms (docs/testing.md):

- **smoke** (the default, what ``make test`` and CI run on both databases): the schema's
  examples and ``LOOPWRIGHT_FUZZ_EXAMPLES`` (default 20) generated cases per operation,
  positive and negative, derandomized so a failure reproduces; a couple of minutes on 2 cores.
- **long** (``LOOPWRIGHT_FUZZ=long``, by hand): adds schemathesis's coverage phase (boundary
  values, missing and duplicated parameters, wrong types and methods for every parameter) and
  300 generated cases per operation; with ``LOOPWRIGHT_FUZZ_SEED=random`` a new seed each run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis import Case, CheckContext, Response
from schemathesis.config import PositiveDataAcceptanceConfig

from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import api_token_create, user_ensure
from orchestrator.wsgi import application

LONG = os.environ.get("LOOPWRIGHT_FUZZ", "smoke") == "long"
EXAMPLES = int(os.environ.get("LOOPWRIGHT_FUZZ_EXAMPLES", "300" if LONG else "20"))
DETERMINISTIC = os.environ.get("LOOPWRIGHT_FUZZ_SEED", "fixed") != "random"
PROBLEM = "application/problem+json"
EVENT_STREAM = "text/event-stream"

schema = schemathesis.openapi.from_wsgi("/api/schema/", application)
schema.config.generation.update(max_examples=EXAMPLES, deterministic=DETERMINISTIC)
schema.config.phases.coverage.enabled = LONG
# A schema cannot say that an employee's endpoint must exist or that a cron expression must
# parse: such schema-valid input is refused with a 400 that names the field (checked below).
schema.config.checks.positive_data_acceptance = PositiveDataAcceptanceConfig(
    expected_statuses=["2xx", "3xx", "400", "401", "403", "404", "409", "429"]
)


def refusals_are_problems(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """Every 4xx is problem+json with a title (an SSE `error` event on a stream), and a 400
    names each field it refuses."""
    if not 400 <= response.status_code < 500 or response.status_code == 405:
        return None
    content_type = response.headers.get("content-type", [""])[0]
    if content_type.startswith(EVENT_STREAM):  # an `error` event, for EventSource clients
        assert response.text.startswith("event: error\n"), response.text
        return None
    assert content_type.startswith(PROBLEM), response.headers
    body = response.json()
    assert body.get("title") and body.get("status") == response.status_code, body
    if response.status_code == 400:
        for error in body.get("errors") or []:
            assert error.get("pointer") is not None and error.get("detail"), body
    return None


@pytest.fixture
def admin_token(db: None) -> Iterator[str]:
    """An admin's bearer token. The WSGI handler closes the connection at the end of each request
    (``close_old_connections``), which would end the test's transaction: disconnected here, as
    Django's test client does."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        user = user_ensure(username="fuzz-admin", roles=(Role.ADMIN,))
        yield api_token_create(user=user, name="fuzz")
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@schema.parametrize()
@settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_api_conforms_to_its_schema(case: Case, admin_token: str) -> None:
    case.call_and_validate(
        headers={"Authorization": f"Bearer {admin_token}"},
        additional_checks=[refusals_are_problems],
    )

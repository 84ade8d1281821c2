"""Shared fixtures: personas with roles, and API clients authenticated as them."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator

import pytest
from django.apps import apps as django_apps
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from rest_framework.test import APIClient

from loops import db
from orchestrator import wakeups
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import api_token_create, user_ensure
from orchestrator.dbthreads import off_loop_threads_close
from tests.support import workers
from tests.support.approvals import http_reply
from tests.support.model_server import ModelServer
from tests.support.pgbouncer import end_other_sessions, release_database
from tests.support.phases import deselect_for_phase
from tests.support.write_paths import EXACT, FAST

PERSONAS: dict[str, tuple[Role, ...]] = {
    "admin": (Role.ADMIN,),
    "operator": (Role.OPERATOR,),
    "approver": (Role.APPROVER,),
    "viewer": (Role.VIEWER,),
    "outsider": (),
}


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None) -> Iterator[None]:
    """pytest-django's test database; the live streams' wake-up hub (its own connection to the
    database, ``orchestrator.wakeups``) is stopped before the database is dropped, and so are
    PgBouncer's connections to it when the suite runs through one (scripts/pgbouncer-suite.sh).
    The connections the off-loop pools' threads keep (``orchestrator.dbthreads``) close first."""
    yield
    wakeups.hub_stop()
    off_loop_threads_close()
    name = connections[DEFAULT_DB_ALIAS].settings_dict["NAME"]
    release_database(name)
    if connections[DEFAULT_DB_ALIAS].vendor == "postgresql" and not settings.DB_POOLER:
        # A session some test left open (a subprocess's or a thread's) would make the drop
        # fail: it is waited for, then ended, and named in the log so the leak can be found.
        for session in end_other_sessions(_maintenance_url(), name):
            print(f"\nsession left on {name} at the end, ended: {session}", file=sys.stderr)


def _maintenance_url() -> str:
    """The test server's ``postgres`` database, as the suite's own connection reaches it."""
    return workers.test_database_url().rsplit("/", 1)[0] + "/postgres"


@pytest.fixture
def api_client_for(db: None) -> Callable[[str], APIClient]:
    """``api_client_for("operator")``: a client with a bearer token of that persona."""

    def make(persona: str) -> APIClient:
        client = APIClient()
        if persona == "anonymous":
            return client
        user = user_ensure(username=persona, roles=PERSONAS[persona])
        token = api_token_create(user=user, name="test")
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        return client

    return make


@pytest.fixture
def operator_client(api_client_for: Callable[[str], APIClient]) -> APIClient:
    return api_client_for("operator")


@pytest.fixture
def viewer_client(api_client_for: Callable[[str], APIClient]) -> APIClient:
    return api_client_for("viewer")


@pytest.fixture
def admin_client_api(api_client_for: Callable[[str], APIClient]) -> APIClient:
    return api_client_for("admin")


@pytest.fixture
def seeded_profiles(transactional_db: None) -> None:
    """The harness profiles of the seed migration, for transactional tests: the flush between
    such tests deletes migration data, so seed again (the seed function is idempotent)."""
    importlib.import_module("harness.migrations.0002_seed_profiles").seed(django_apps, None)


@pytest.fixture
def write_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """The path the test's writes take (``tests.support.write_paths.both_write_paths``): the
    fast one (the test is transactional, as production is) or the exact one (forced)."""
    path = getattr(request, "param", EXACT)
    if path == FAST:
        yield FAST
        return
    with db.exact_path_forced():
        yield EXACT


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    deselect_for_phase(config, items)


@pytest.fixture
def role_model() -> Iterator[ModelServer]:
    """The loopback model server answering every role by the approvals script
    (``tests.support.approvals.script_turn``): the leader plans, the maker proposes its input's
    ``rounds``, the verifier passes."""
    with ModelServer() as server:
        server.always(http_reply)
        yield server
    server.check()

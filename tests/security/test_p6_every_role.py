"""docs/reliability.md P6 across the roles: nothing of the server within any persona's reach.

Every persona (anonymous, outsider, viewer, approver, operator, admin) tries, through the REST
API, to name a server variable as a model endpoint's key, to point a ``local-dir`` skill at a
host directory, and to import skills from a host path or a ``file://`` URL. Below operator the
call is refused by role (401/403); operator and admin get a 400 problem whose detail names the
rule that refused. Nothing is created, and no host file shows up in any response.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from orchestrator.agents.models import ModelEndpoint
from skillhub.models import Skill

pytestmark = pytest.mark.django_db

PROBLEM = "application/problem+json"
PERSONAS = ("anonymous", "outsider", "viewer", "approver", "operator", "admin")
MAY_WRITE = {"operator", "admin"}
#: A line every Debian/Ubuntu /etc/passwd has: it must never reach a response.
HOST_FILE_MARK = "root:x:0:0"


def endpoint_body(api_key_env: str) -> dict[str, Any]:
    return {
        "name": f"p6-{api_key_env.lower()}",
        "base_url": "https://models.example.com/v1",
        "model": "m",
        "api_key_env": api_key_env,
    }


def skill_body(source_ref: str) -> dict[str, Any]:
    return {
        "tool_name": "p6_host_dir",
        "title": "Reads the host",
        "code_template": "print(open('hello').read())",
        "language": "python",
        "input_schema": {"type": "object", "properties": {}},
        "source": "local-dir",
        "source_ref": source_ref,
    }


def assert_refused(persona: str, response: Any, pointer: str, rule: str) -> None:
    assert HOST_FILE_MARK not in response.content.decode(errors="replace")
    if persona not in MAY_WRITE:
        assert response.status_code in (401, 403), (persona, response.content)
        return
    assert response.status_code == 400, (persona, response.content)
    assert response["Content-Type"] == PROBLEM
    problem = response.json()
    details = [e["detail"] for e in problem.get("errors", []) if e.get("pointer") == pointer]
    text = " ".join(details) or problem["detail"]
    assert rule in text, (persona, pointer, text)


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("name", ["SECRET_KEY", "DATABASE_URL", "PATH", "HOME", "REDIS_URL"])
def test_no_role_can_name_a_server_variable_as_a_key(
    api_client_for: Callable[[str], APIClient], persona: str, name: str
) -> None:
    client = api_client_for(persona)
    response = client.post("/api/v1/model-endpoints", endpoint_body(name), format="json")
    assert_refused(persona, response, "/api_key_env", "LOOPWRIGHT_SECRET_")
    assert not ModelEndpoint.objects.filter(api_key_env=name).exists()


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("source_ref", ["/", "/etc", "/root"])
def test_no_role_can_point_a_skill_at_a_host_directory(
    api_client_for: Callable[[str], APIClient], persona: str, source_ref: str
) -> None:
    client = api_client_for(persona)
    response = client.post("/api/v1/skills", skill_body(source_ref), format="json")
    assert_refused(persona, response, "/source_ref", "LOOPWRIGHT_SKILL_LOCAL_ROOTS")
    assert not Skill.objects.exists()


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("repository", ["/etc", "file:///etc", "file:///root/.git"])
def test_no_role_can_import_skills_from_a_host_path(
    api_client_for: Callable[[str], APIClient], persona: str, repository: str
) -> None:
    client = api_client_for(persona)
    for action in ("gitListSkills", "gitSyncSkills"):
        response = client.post(
            f"/api/v1/skills/{action}", {"repository": repository, "ref": "HEAD"}, format="json"
        )
        assert_refused(persona, response, "/repository", "LOOPWRIGHT_GIT_SCHEMES")
    assert not Skill.objects.exists()

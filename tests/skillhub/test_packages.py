"""Declared packages: specs validated on save (names with an optional exact version, nothing an
installer could be tricked with, each name once). Installing them: test_skill_envs.py."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from skillhub.models import Skill
from tests.skillhub.conftest import NUMBERS

PROBLEM = "application/problem+json"
MARKER = "import sys\nprint('program ran')\n"


def body(**overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "tool_name": "pkg_skill",
        "title": "Packages",
        "code_template": MARKER,
        "language": "python",
        "input_schema": NUMBERS,
    }
    values.update(overrides)
    return values


def pointers(response: Any) -> list[str]:
    return [e["pointer"] for e in response.json().get("errors", [])]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("language", "name"),
    [
        ("python", "numpy; rm -rf /"),
        ("python", "$(id)"),
        ("python", "`id`"),
        ("python", "../../etc/passwd"),
        ("python", "/usr/lib/python3"),
        ("python", "numpy>=1.0"),
        ("python", "requests==2"),
        ("python", "git+https://example.com/x.git"),
        ("python", "a b"),
        ("python", "numpy\nrm -rf /"),
        ("python", ""),
        ("python", "-e"),
        ("python", "_ssl"),
        ("python", "numpy[extra]"),
        ("python", "numpy==1.2.3.4"),
        ("python", "numpy==1.0rc1"),
        ("python", "trailing-"),
        ("node", "lodash@^4.17.0"),
        ("node", "lodash@latest"),
        ("node", "../x"),
        ("node", "@scope/../x"),
        ("node", "lodash@4"),
        ("node", "/abs/path"),
        ("node", "x|y"),
        ("node", ".hidden"),
    ],
)
def test_unsafe_package_names_are_refused_on_save(
    operator_client: APIClient, language: str, name: str
) -> None:
    response = operator_client.post(
        "/api/v1/skills", body(language=language, packages=["okname", name]), format="json"
    )
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == PROBLEM
    assert pointers(response) == ["/packages/1"]
    assert not Skill.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("language", "names"),
    [
        ("python", ["numpy==1.26.4", "PyYAML", "typing-extensions", "zope.interface==6.1"]),
        ("node", ["lodash@4.17.21", "@scope/pkg-name", "left-pad", "socket.io@4.7.5-beta.1"]),
    ],
)
def test_package_names_are_accepted_on_save(
    operator_client: APIClient, language: str, names: list[str]
) -> None:
    response = operator_client.post(
        "/api/v1/skills", body(language=language, packages=names), format="json"
    )
    assert response.status_code == 201, response.content
    assert response.json()["packages"] == names


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("language", "names"),
    [("python", ["Py_Yaml", "py-yaml==6.0"]), ("node", ["lodash", "lodash@4.17.21"])],
)
def test_a_package_named_twice_is_refused(
    operator_client: APIClient, language: str, names: list[str]
) -> None:
    response = operator_client.post(
        "/api/v1/skills", body(language=language, packages=names), format="json"
    )
    assert response.status_code == 400, response.content
    assert response.json()["errors"] == [{
        "pointer": "/packages/1", "code": "invalid",
        "detail": f"{names[1]!r} names the same package as /packages/0",
    }]  # fmt: skip

"""Declared packages: names validated on save; before each run a preflight in the real sandbox
(same interpreter and files as the program) checks that each one can be found, and a missing
one fails the execution with a message naming it instead of an ImportError mid-run."""

from __future__ import annotations

import base64
import io
import zipfile
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import user_ensure
from skillhub.models import Skill, SkillExecution, SkillExecutionEvent
from skillhub.services.access import Caller
from skillhub.services.executions import execution_request, execution_run
from skillhub.services.packages import packages_missing_text
from tests.skillhub.conftest import NUMBERS, SKILL_QUEUE, TEXT, SkillsWorker

PROBLEM = "application/problem+json"
#: Some tests run executions inline beside a module-scoped skills worker (conftest).
INLINE_EXECUTIONS = True
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
        ("python", ["numpy", "xml.etree.ElementTree", "typing-extensions", "PIL", "_ssl"]),
        ("node", ["lodash", "@scope/pkg-name", "left-pad", "socket.io"]),
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


def test_the_error_names_the_missing_packages() -> None:
    assert packages_missing_text(["numpy"], "python").startswith(
        "package 'numpy' is not installed on this skills worker; install it on the worker "
        "image or remove it from packages"
    )
    assert packages_missing_text(["a", "b"], "node").startswith(
        "packages 'a', 'b' are not installed on this skills worker; install them"
    )


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_a_missing_python_package_fails_before_the_program_runs(
    skills_worker: SkillsWorker,
    api_client_for: Callable[[str], APIClient],
    make_skill: Callable[..., Skill],
) -> None:
    # "json" is the standard library (found); the other two are on no worker.
    make_skill(
        code_template=MARKER + "import loopwright_absent_pkg\n",
        packages=["json", "loopwright_absent_pkg", "loopwright-absent-two"],
    )
    client = api_client_for("operator")
    response = client.post("/api/v1/skills/py_add/test", {"inputs": {"a": 1}}, format="json")
    assert response.status_code == 200, (response.content, skills_worker.log()[-3000:])
    execution = response.json()
    assert execution["status"] == "failed"
    assert execution["error"] == packages_missing_text(
        ["loopwright_absent_pkg", "loopwright-absent-two"], "python"
    )
    assert execution["stdout"] == "" and execution["exit_code"] is None  # never ran
    events = client.get(f"/api/v1/skill-executions/{execution['id']}/events").json()
    assert [e["type"] for e in events] == [
        "queued", "claimed", "rendering", "packages_checked", "failed",
    ]  # fmt: skip
    assert events[3]["data"] == {
        "packages": ["json", "loopwright_absent_pkg", "loopwright-absent-two"],
        "missing": ["loopwright_absent_pkg", "loopwright-absent-two"],
    }


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_available_packages_pass_the_check_and_the_program_runs(
    skills_worker: SkillsWorker,
    api_client_for: Callable[[str], APIClient],
    make_skill: Callable[..., Skill],
) -> None:
    make_skill(
        code_template="import json, xml.etree.ElementTree\nprint(json.dumps({{a}}))\n",
        packages=["json", "xml.etree.ElementTree", "sqlite3"],
    )
    client = api_client_for("operator")
    response = client.post("/api/v1/skills/py_add/test", {"inputs": {"a": 7}}, format="json")
    execution = response.json()
    assert (execution["status"], execution["stdout"]) == ("succeeded", "7\n"), (
        execution,
        skills_worker.log()[-3000:],
    )
    events = client.get(f"/api/v1/skill-executions/{execution['id']}/events").json()
    checked = [e["data"] for e in events if e["type"] == "packages_checked"]
    assert checked == [{"packages": ["json", "xml.etree.ElementTree", "sqlite3"], "missing": []}]


def _zip(files: dict[str, str]) -> str:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_node_packages_are_resolved_in_the_sandbox(
    operator_client: APIClient, make_skill: Callable[..., Skill], settings: Any
) -> None:
    """A module under ``.node_modules`` of the working directory (the sandbox's HOME) is found
    by ``require.resolve`` like one on the worker image; an absent one fails the run. Runs the
    worker's execution path in this process (the same function the Celery task calls)."""
    # A queue no worker consumes: this process runs the executions itself.
    settings.SKILLHUB = {**settings.SKILLHUB, "QUEUE": f"{SKILL_QUEUE}-packages"}
    code = "const shout = require('shout');\nconsole.log(shout({{text}}));\n"
    module = "module.exports = (s) => s.toUpperCase() + '!';\n"
    created = operator_client.post(
        "/api/v1/skills",
        {
            "tool_name": "node_shout", "title": "Shout", "language": "node",
            "code_template": code, "input_schema": TEXT, "packages": ["shout", "fs"],
            "archive_base64": _zip({".node_modules/shout/index.js": module}),
        },
        format="json",
    )  # fmt: skip
    assert created.status_code == 201, created.content
    absent = make_skill(
        "node_absent", language="node", input_schema=TEXT,
        code_template="console.log({{text}});\n", packages=["loopwright-absent-node"],
    )  # fmt: skip
    caller = Caller.for_user(user_ensure(username="operator", roles=[Role.OPERATOR]))
    ok = execution_request(
        skill=Skill.objects.get(tool_name="node_shout"), inputs={"text": "hi"},
        caller=caller, origin="api",
    )  # fmt: skip
    bad = execution_request(skill=absent, inputs={"text": "hi"}, caller=caller, origin="api")
    for execution in (ok, bad):
        execution_run(execution_id=execution.id, owner="test-worker")
    ok_done, bad_done = (SkillExecution.objects.get(pk=e.id) for e in (ok, bad))
    assert (ok_done.status, ok_done.stdout) == ("succeeded", "HI!\n"), ok_done.stderr
    assert bad_done.status == "failed" and bad_done.stdout == ""
    assert bad_done.error == packages_missing_text(["loopwright-absent-node"], "node")
    checked = SkillExecutionEvent.objects.get(execution=bad, type="packages_checked")
    assert checked.data["missing"] == ["loopwright-absent-node"]

"""local-dir skills are confined to the roots an admin lists (``LOOPWRIGHT_SKILL_LOCAL_ROOTS``,
none by default): host paths, the var directory, workspaces, ``..`` escapes and symlinks out are
refused through the REST API with an operator token (400 at ``/source_ref`` naming the rule),
checked again when the folder is copied into the sandbox; a folder under a root runs."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import user_ensure
from skillhub.models import Skill, SkillExecution
from skillhub.services.access import Caller
from skillhub.services.executions import execution_request, execution_run
from skillhub.services.localdir import SETTING, local_dir_files, parse_local_roots
from tests.support.workers import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
PROBLEM = "application/problem+json"
EMPTY = {"type": "object", "properties": {}}
READS_HELPER = (
    "import json, os\n"
    "exec(open('helper.py').read())\n"
    "print(greet(open('data/name.txt').read().strip()))\n"
    "print(json.dumps(sorted(os.listdir('.'))))\n"
)


def body(source_ref: str, **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "tool_name": "local_skill",
        "title": "Local",
        "code_template": READS_HELPER,
        "language": "python",
        "input_schema": EMPTY,
        "source": "local-dir",
        "source_ref": source_ref,
    }
    data.update(overrides)
    return data


@pytest.fixture
def skill_root(tmp_path: Path, settings: Any) -> Path:
    """A configured skill root holding one good skill folder, ``<root>/hello``."""
    root = tmp_path / "skill-roots"
    folder = root / "hello"
    (folder / "data").mkdir(parents=True)
    (folder / "helper.py").write_text("def greet(name):\n    return 'hello ' + name\n")
    (folder / "data" / "name.txt").write_text("world\n")
    for path in (tmp_path, root, folder, folder / "data"):
        path.chmod(0o755)
    settings.SKILLHUB = {**settings.SKILLHUB, "LOCAL_ROOTS": (str(root),)}
    return root


def refused(client: APIClient, source_ref: str) -> str:
    """POST a local-dir skill; assert the 400 problem points at /source_ref; its detail."""
    response = client.post("/api/v1/skills", body(source_ref), format="json")
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == PROBLEM
    [error] = [e for e in response.json()["errors"] if e["pointer"] == "/source_ref"]
    assert not Skill.objects.exists()
    return str(error["detail"])


# --- refused at save time ----------------------------------------------------------------------


def test_without_roots_every_local_dir_skill_is_refused(
    operator_client: APIClient, tmp_path: Path
) -> None:
    for ref in ("/", "/etc", str(tmp_path)):
        detail = refused(operator_client, ref)
        assert "local-dir skills are off" in detail and SETTING in detail


@pytest.mark.parametrize("ref", ["/", "/etc", "/root", "/etc/ssl", "/proc/self"])
def test_host_directories_are_refused(
    operator_client: APIClient, skill_root: Path, ref: str
) -> None:
    detail = refused(operator_client, ref)
    assert "outside every skill root" in detail and str(skill_root) in detail


def test_the_var_directory_and_workspaces_are_refused_even_inside_a_root(
    operator_client: APIClient, skill_root: Path, settings: Any
) -> None:
    var = skill_root / "var"
    workspace = var / "workspaces" / str(uuid.uuid4())
    workspace.mkdir(parents=True)
    (var / "admin-password").write_text("s3cret")
    settings.VAR_DIR = var
    assert "lies in the service's var directory" in refused(operator_client, str(var))
    assert "var directory" in refused(operator_client, str(workspace))
    detail = refused(operator_client, str(skill_root))  # the root itself holds the var dir
    assert "contains the service's var directory" in detail


def test_a_dot_dot_escape_is_refused(operator_client: APIClient, skill_root: Path) -> None:
    detail = refused(operator_client, f"{skill_root}/hello/../../../../etc")
    assert "'..' segment" in detail


def test_a_symlink_leading_out_of_the_roots_is_refused(
    operator_client: APIClient, skill_root: Path
) -> None:
    (skill_root / "etc-link").symlink_to("/etc")
    detail = refused(operator_client, str(skill_root / "etc-link"))
    assert "resolves to /etc" in detail and "outside every skill root" in detail


def test_a_symlink_inside_the_folder_to_etc_shadow_is_refused(
    operator_client: APIClient, skill_root: Path
) -> None:
    (skill_root / "hello" / "data" / "shadow").symlink_to("/etc/shadow")
    detail = refused(operator_client, str(skill_root / "hello"))
    assert "data/shadow" in detail and "symlink leading out" in detail


def test_a_root_of_slash_set_by_override_is_ignored(
    operator_client: APIClient, settings: Any
) -> None:
    settings.SKILLHUB = {**settings.SKILLHUB, "LOCAL_ROOTS": ("/",)}
    assert "local-dir skills are off" in refused(operator_client, "/etc")


def test_a_relative_source_ref_is_refused(operator_client: APIClient, skill_root: Path) -> None:
    assert "absolute directory path" in refused(operator_client, "hello")


# --- the setting ---------------------------------------------------------------------------------


def test_roots_are_parsed_from_pathsep_or_commas() -> None:
    assert parse_local_roots(None) == ()
    assert parse_local_roots(" /srv/a:/srv/b/ , /srv/c,,/srv/a") == ("/srv/a", "/srv/b", "/srv/c")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("/", "resolves to '/'"), ("/etc", "host system directory"), ("skills", "not an absolute")],
)
def test_a_bad_root_stops_the_service_at_start(value: str, expected: str) -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "orchestrator.settings", SETTING: value}
    started = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert started.returncode != 0
    assert "ImproperlyConfigured" in started.stderr
    assert SETTING in started.stderr and expected in started.stderr


# --- at execution time -------------------------------------------------------------------------


def run_skill(skill_name: str = "local_skill") -> SkillExecution:
    user = user_ensure(username="operator", roles=[Role.OPERATOR])
    execution = execution_request(
        skill=Skill.objects.get(tool_name=skill_name),
        inputs={},
        caller=Caller.for_user(user),
        origin="test",
    )
    done = execution_run(execution_id=execution.id, owner="inline-test")
    assert done is not None
    return done


def test_a_skill_under_a_configured_root_runs(operator_client: APIClient, skill_root: Path) -> None:
    folder = skill_root / "hello"
    (folder / "same.txt").symlink_to(folder / "data" / "name.txt")  # inside: skipped, not read
    response = operator_client.post("/api/v1/skills", body(str(folder)), format="json")
    assert response.status_code == 201, response.content
    done = run_skill()
    assert done.status == "succeeded", (done.error, done.stderr)
    assert done.stdout.splitlines() == ["hello world", '["data", "helper.py", "out"]']
    assert done.attempts == 1
    rendering = done.events.get(type="rendering").data
    assert rendering["files"] == 2 and rendering["skipped"] == ["same.txt"]


def test_the_folder_is_checked_again_when_it_is_copied(
    operator_client: APIClient, skill_root: Path, settings: Any
) -> None:
    folder = skill_root / "hello"
    response = operator_client.post("/api/v1/skills", body(str(folder)), format="json")
    assert response.status_code == 201, response.content
    (folder / "data" / "shadow").symlink_to("/etc/shadow")  # added after the save
    done = run_skill()
    assert done.status == "failed" and done.attempts == 1
    assert "LocalDirRefused" in done.error and "symlink leading out" in done.error
    assert "root:" not in done.stdout
    (folder / "data" / "shadow").unlink()
    settings.SKILLHUB = {**settings.SKILLHUB, "LOCAL_ROOTS": ()}  # the admin removed the root
    again = run_skill()
    assert again.status == "failed" and "local-dir skills are off" in again.error


def test_the_copy_stays_within_the_size_cap(skill_root: Path) -> None:
    big = skill_root / "hello" / "big.bin"
    big.write_bytes(b"x" * 4096)
    with pytest.raises(Exception, match="over 1024 bytes"):
        local_dir_files(str(skill_root / "hello"), max_bytes=1024)
    copy = local_dir_files(str(skill_root / "hello"), max_bytes=10_000)
    assert sorted(copy.files) == ["big.bin", "data/name.txt", "helper.py"]

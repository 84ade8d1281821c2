"""Per-skill package environments (issue 27): declared packages are installed with the real pip
and npm from a local PEP 503 index / npm registry on loopback (wheels and tarballs built here),
outside the sandbox, and bound read-only into the real sandbox for that skill's runs; the
resolved versions are pinned and installed again after clearStorage; a package that cannot be
had fails the execution naming it; the size cap and the build timeout hold; two concurrent
builds of one key build once; initEnv / clearStorage through the API and the skill page.

Executions run in this process with ``execution_run`` (what a skills worker does)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import user_ensure
from skillhub.models import Skill, SkillEnvironment, SkillExecution, SkillExecutionEvent
from skillhub.services.access import Caller
from skillhub.services.envbuild import EnvPlan, _minimal_env, interpreter_version
from skillhub.services.executions import execution_request, execution_run
from tests.skillhub.conftest import SKILL_QUEUE, TEXT, start_skills_worker
from tests.support.package_index import PackageServer, package_server

pytestmark = [
    pytest.mark.one_backend,
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
]
#: Executions run inline here: nudges go to a queue nobody consumes (conftest).
INLINE_EXECUTIONS = True

TINY_V1 = {"tinypkg/__init__.py": b"VALUE = 'tiny 1.0.0'\n"}
TINY_V2 = {"tinypkg/__init__.py": b"VALUE = 'tiny 1.1.0'\n"}
PY_USE = (
    "import os, tinypkg\n"
    "print(tinypkg.VALUE, {{text}})\n"
    "target = os.path.join(os.path.dirname(tinypkg.__file__), 'planted.py')\n"
    "try:\n"
    "    open(target, 'w').write('x = 1\\n')\n"
    "    print('WRITABLE')\n"
    "except OSError as exc:\n"
    "    print('read-only:', exc.errno)\n"
)
NODE_USE = (
    "const shout = require('shout');\n"
    "const fs = require('fs');\n"
    "console.log(shout({{text}}));\n"
    "try { fs.writeFileSync(require.resolve('shout') + '.planted', 'x'); console.log('WRITABLE'); }\n"
    "catch (err) { console.log('read-only: ' + err.code); }\n"
)
SHOUT = {"index.js": b"module.exports = (s) => s.toUpperCase() + '!';\n"}


@pytest.fixture
def index() -> Iterator[PackageServer]:
    with package_server() as server:
        server.add_wheel("tinypkg", "1.0.0", TINY_V1)
        server.add_npm("shout", "1.0.0", SHOUT)
        yield server


@pytest.fixture
def env_dir() -> Iterator[Path]:
    """A cache the sandbox uid can traverse (pytest's tmp_path is 0700 to root)."""
    path = Path(tempfile.mkdtemp(prefix="lw-skill-envs-", dir="/tmp"))
    path.chmod(0o755)
    yield path / "envs"
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def envs(settings: Any, index: PackageServer, env_dir: Path) -> PackageServer:
    settings.SKILLHUB = {
        **settings.SKILLHUB,
        "ENV_DIR": str(env_dir),
        "PIP_INDEX_URL": f"{index.url}/simple",
        "NPM_REGISTRY": index.url,
        "ENV_MAX_MB": 64,
        "ENV_BUILD_TIMEOUT_SECONDS": 120.0,
    }
    return index


def _caller() -> Caller:
    return Caller.for_user(user_ensure(username="operator", roles=[Role.OPERATOR]))


def _run(skill: Skill, text: str = "hi") -> SkillExecution:
    execution = execution_request(skill=skill, inputs={"text": text}, caller=_caller(),
                                  origin="api")  # fmt: skip
    execution_run(execution_id=execution.id, owner="test-worker")
    return SkillExecution.objects.get(pk=execution.id)


def _skill(make_skill: Callable[..., Skill], name: str, **fields: Any) -> Skill:
    return make_skill(name, input_schema=TEXT, **fields)


def test_a_python_package_is_installed_pinned_read_only_and_rebuilt_with_its_pins(
    envs: PackageServer, env_dir: Path, make_skill: Callable[..., Skill],
    operator_client: APIClient,
) -> None:  # fmt: skip
    skill = _skill(make_skill, "py_tiny", code_template=PY_USE, packages=["tinypkg"])
    done = _run(skill)
    assert done.status == "succeeded", (done.error, done.stderr)
    assert done.stdout == "tiny 1.0.0 hi\nread-only: 30\n"  # EROFS: the bind is read-only
    row = SkillEnvironment.objects.get()
    assert (row.status, row.pins, row.lock) == ("ready", ["tinypkg==1.0.0"], "tinypkg==1.0.0\n")
    event = SkillExecutionEvent.objects.get(execution=done, type="packages_checked")
    assert event.data["pins"] == ["tinypkg==1.0.0"] and event.data["built"] is True
    assert not list(env_dir.glob(f"{row.key}/site-packages/tinypkg/planted.py"))

    # A newer release does not move the bare name: reuse, then clearStorage and a rebuild.
    envs.add_wheel("tinypkg", "1.1.0", TINY_V2)
    again = _run(skill)
    assert again.stdout.startswith("tiny 1.0.0 hi\n")
    reused = SkillExecutionEvent.objects.get(execution=again, type="packages_checked")
    assert reused.data["built"] is False
    cleared = operator_client.delete("/api/v1/skills/py_tiny/env")
    assert cleared.status_code == 200, cleared.content
    assert cleared.json()["removed"] is True
    assert (cleared.json()["status"], cleared.json()["on_disk"]) == ("cleared", False)
    assert not (env_dir / row.key).exists()
    rebuilt = _run(skill)
    assert rebuilt.status == "succeeded" and rebuilt.stdout.startswith("tiny 1.0.0 hi\n")
    assert envs.served["tinypkg-1.1.0-py3-none-any.whl"] == 0
    assert envs.served["tinypkg-1.0.0-py3-none-any.whl"] == 2
    assert SkillEnvironment.objects.get().pins == ["tinypkg==1.0.0"]


def test_a_python_package_that_cannot_be_had_fails_the_execution_naming_it(
    envs: PackageServer, make_skill: Callable[..., Skill]
) -> None:
    skill = _skill(make_skill, "py_absent", code_template="print({{text}})\n",
                   packages=["tinypkg", "absent-dist==1.2"])  # fmt: skip
    done = _run(skill)
    assert (done.status, done.stdout, done.exit_code) == ("failed", "", None)
    assert done.error.startswith(f"package 'absent-dist==1.2' cannot be installed from {envs.url}")
    assert "No matching distribution found for absent-dist==1.2" in done.error
    assert "'tinypkg'" not in done.error
    types = list(
        SkillExecutionEvent.objects.filter(execution=done)
        .order_by("seq")
        .values_list("type", flat=True)
    )
    assert types == ["queued", "claimed", "rendering", "failed"]
    row = SkillEnvironment.objects.get()
    assert row.status == "failed" and "absent-dist" in row.error


def test_an_environment_over_the_size_cap_is_deleted_and_fails_the_run(
    envs: PackageServer, env_dir: Path, settings: Any, make_skill: Callable[..., Skill]
) -> None:
    settings.SKILLHUB = {**settings.SKILLHUB, "ENV_MAX_MB": 1}
    envs.add_wheel("bigpkg", "2.0", {"bigpkg/__init__.py": b"", "bigpkg/blob.bin": os.urandom(
        3 * 1024 * 1024)})  # fmt: skip
    skill = _skill(make_skill, "py_big", code_template="print({{text}})\n", packages=["bigpkg"])
    done = _run(skill)
    assert done.status == "failed"
    assert "is 3.0 MB, over the size cap of 1.0 MB (LOOPWRIGHT_SKILL_ENV_MAX_MB)" in done.error
    assert [p.name for p in env_dir.iterdir() if not p.name.endswith(".lock")] == []


def test_a_build_past_its_timeout_is_stopped(
    envs: PackageServer, settings: Any, make_skill: Callable[..., Skill]
) -> None:
    settings.SKILLHUB = {**settings.SKILLHUB, "ENV_BUILD_TIMEOUT_SECONDS": 2.0}
    envs.delay = 30.0  # the index answers nothing for 30 s
    skill = _skill(make_skill, "py_slow", code_template="print({{text}})\n", packages=["tinypkg"])
    done = _run(skill)
    assert done.status == "failed"
    assert done.error == (
        "pip did not finish within 2 s (LOOPWRIGHT_SKILL_ENV_BUILD_TIMEOUT); the build was stopped"
    )


def test_a_node_package_is_installed_and_required_read_only(
    envs: PackageServer, make_skill: Callable[..., Skill]
) -> None:
    envs.add_npm("@acme/ping", "2.0.1", {"index.js": b"module.exports = 'pong';\n"})
    skill = _skill(make_skill, "node_shout", language="node", code_template=NODE_USE,
                   packages=["shout", "@acme/ping@2.0.1"])  # fmt: skip
    done = _run(skill)
    assert done.status == "succeeded", (done.error, done.stderr)
    assert done.stdout == "HI!\nread-only: EROFS\n"
    row = SkillEnvironment.objects.get()
    assert row.pins == ["@acme/ping@2.0.1", "shout@1.0.0"]
    assert '"node_modules/shout"' in row.lock  # the package-lock.json, for the rebuild

    absent = _skill(make_skill, "node_absent", language="node",
                    code_template="console.log({{text}});\n",
                    packages=["shout", "loopwright-absent-node"])  # fmt: skip
    failed = _run(absent)
    assert failed.status == "failed" and failed.stdout == ""
    assert failed.error.startswith("package 'loopwright-absent-node' cannot be installed")


#: One skills worker's build, in a process of its own: waits for the start file, then builds.
_BUILDER = """
import json, sys, time
from pathlib import Path
from skillhub.services.envbuild import EnvLimits, EnvPlan, env_ensure
root, index, version, go = sys.argv[1:]
while not Path(go).exists():
    time.sleep(0.005)
plan = EnvPlan("python", "/usr/bin/python3", version, ("tinypkg",), index)
env = env_ensure(root=Path(root), plan=plan, lock="", limits=EnvLimits(64 << 20, 60))
print(json.dumps({"built": env.built, "path": str(env.path), "pins": env.pins}))
"""


def test_two_concurrent_builds_of_one_key_build_once(
    index: PackageServer, env_dir: Path, tmp_path: Path
) -> None:
    """Three processes (as three skills workers) build one key at the same moment: one builds,
    the others wait on the key's lock and reuse it; the index served the wheel once."""
    version = interpreter_version("/usr/bin/python3", "python")
    index.delay = 0.3  # the first build is surely still running when the others ask
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _BUILDER, str(env_dir), f"{index.url}/simple", version, str(go)],
            cwd=Path(__file__).resolve().parents[2],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    time.sleep(0.5)  # all three are waiting for the start file
    go.touch()
    outputs = [json.loads(proc.communicate(timeout=120)[0]) for proc in procs]
    assert sorted(o["built"] for o in outputs) == [False, False, True]
    key = EnvPlan("python", "/usr/bin/python3", version, ("tinypkg",), f"{index.url}/simple").key
    assert {o["path"] for o in outputs} == {str(env_dir / key)}
    assert all(o["pins"] == ["tinypkg==1.0.0"] for o in outputs)
    assert index.served["tinypkg-1.0.0-py3-none-any.whl"] == 1


def test_pip_and_npm_get_no_server_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DJANGO_SECRET_KEY", "s3cret")
    monkeypatch.setenv("DATABASE_URL", "postgres://u:p@db/x")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    env = _minimal_env(tmp_path)
    assert set(env) == {"PATH", "HOME", "TMPDIR", "LANG", "HTTPS_PROXY"}


def test_init_env_and_clear_storage_through_the_api(
    envs: PackageServer, make_skill: Callable[..., Skill],
    api_client_for: Callable[[str], APIClient],
) -> None:  # fmt: skip
    _skill(make_skill, "py_api", code_template="print({{text}})\n", packages=["tinypkg"])
    operator, viewer = api_client_for("operator"), api_client_for("viewer")
    before = viewer.get("/api/v1/skills/py_api/env").json()
    assert (before["status"], before["pins"], before["on_disk"]) == ("missing", [], False)
    assert viewer.post("/api/v1/skills/py_api/env").status_code == 403
    assert viewer.delete("/api/v1/skills/py_api/env").status_code == 403
    built = operator.post("/api/v1/skills/py_api/env")
    assert built.status_code == 200, built.content
    body = built.json()
    assert (body["status"], body["pins"], body["on_disk"]) == ("ready", ["tinypkg==1.0.0"], True)
    assert body["size_bytes"] > 0 and body["built_at"] and body["index_url"].startswith(envs.url)
    assert viewer.get("/api/v1/skills/py_api/env").json()["pins"] == ["tinypkg==1.0.0"]
    assert operator.delete("/api/v1/skills/py_api/env").json()["removed"] is True
    assert operator.delete("/api/v1/skills/py_api/env").json()["removed"] is False
    assert operator.post("/api/v1/skills/py_api/env").json()["status"] == "ready"

    _skill(make_skill, "py_api_bad", code_template="print(1)\n",
           packages=["tinypkg", "absent-dist"])  # fmt: skip
    refused = operator.post("/api/v1/skills/py_api_bad/env")
    assert refused.status_code == 400
    assert refused["Content-Type"] == "application/problem+json"
    assert [e["pointer"] for e in refused.json()["errors"]] == ["/packages/1"]
    plain = make_skill("py_plain")
    assert operator.post(f"/api/v1/skills/{plain.tool_name}/env").json()["status"] == "none"


def _client(persona: str, role: Role) -> Client:
    client = Client()
    client.force_login(user_ensure(username=persona, roles=[role]))
    return client


def test_the_skill_page_shows_the_environment_with_build_and_clear(
    envs: PackageServer, make_skill: Callable[..., Skill]
) -> None:
    _skill(make_skill, "py_page", code_template="print({{text}})\n", packages=["tinypkg"])
    operator = _client("operator", Role.OPERATOR)
    page = operator.get("/skills/py_page").content.decode()
    assert 'id="env-build-form"' in page and 'id="env-clear-form"' in page
    assert "data-confirm=" in page and "resolved at the first build" in page
    built = operator.post("/skills/py_page/env/build")
    assert built.status_code == 302
    page = operator.get("/skills/py_page").content.decode()
    assert "tinypkg==1.0.0" in page and "built on this host" in page
    assert operator.post("/skills/py_page/env/clear").status_code == 302
    assert "not built on this host" in operator.get("/skills/py_page").content.decode()
    viewer_page = _client("viewer", Role.VIEWER).get("/skills/py_page").content.decode()
    assert "tinypkg==1.0.0" in viewer_page and 'id="env-build-form"' not in viewer_page


def test_a_skills_worker_process_builds_the_environment_before_the_run(
    envs: PackageServer, env_dir: Path, settings: Any, tmp_path: Path,
    make_skill: Callable[..., Skill], operator_client: APIClient,
) -> None:  # fmt: skip
    """The production path: a real ``celery worker`` on the skills queue claims the execution,
    builds the environment with its own settings (from its environment) and runs the skill."""
    queue = f"{SKILL_QUEUE}-envs"
    settings.SKILLHUB = {**settings.SKILLHUB, "QUEUE": queue}
    worker = start_skills_worker(
        tmp_path, "envs", LOOPWRIGHT_SKILL_QUEUE=queue, LOOPWRIGHT_SKILL_ENV_DIR=str(env_dir),
        LOOPWRIGHT_SKILL_PIP_INDEX_URL=f"{envs.url}/simple",
    )  # fmt: skip
    try:
        _skill(make_skill, "py_worker", code_template=PY_USE, packages=["tinypkg==1.0.0"])
        response = operator_client.post(
            "/api/v1/skills/py_worker/test",
            {"inputs": {"text": "w"}, "wait_seconds": 60},
            format="json",
        )
        execution = response.json()
        assert execution["status"] == "succeeded", (execution, worker.log()[-3000:])
        assert execution["stdout"] == "tiny 1.0.0 w\nread-only: 30\n"
        assert SkillEnvironment.objects.get().pins == ["tinypkg==1.0.0"]
        assert len([p for p in env_dir.iterdir() if p.is_dir()]) == 1
    finally:
        worker.kill()


def test_the_environment_settings_come_from_the_environment(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "orchestrator.settings",
        "LOOPWRIGHT_VAR_DIR": str(tmp_path / "var"),
        "LOOPWRIGHT_SKILL_ENV_DIR": str(tmp_path / "envs"),
        "LOOPWRIGHT_SKILL_ENV_MAX_MB": "7",
        "LOOPWRIGHT_SKILL_ENV_BUILD_TIMEOUT": "9.5",
        "LOOPWRIGHT_SKILL_PIP_INDEX_URL": "https://pypi.internal/simple",
        "LOOPWRIGHT_SKILL_NPM_REGISTRY": "https://npm.internal/",
    }
    script = (
        "import django, json; django.setup()\n"
        "from skillhub.services.environments import env_limits, env_root, env_plan\n"
        "py, node = env_plan('python', ['x']), env_plan('node', ['y'])\n"
        "limits = env_limits()\n"
        "print(json.dumps([str(env_root()), limits.size_cap_bytes, limits.timeout_seconds,\n"
        "                  py.index_url, node.index_url]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[2], env=env,
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        str(tmp_path / "envs"), 7 * 1024 * 1024, 9.5,
        "https://pypi.internal/simple", "https://npm.internal/",
    ]  # fmt: skip

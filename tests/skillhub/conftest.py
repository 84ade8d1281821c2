"""Fixtures of the Skill Hub tests: skills made through the services, and real ``celery worker``
processes on the ``skills`` queue running executions in the real sandbox."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from skillhub.models import Skill
from skillhub.services.skills import skill_create
from tests.support.workers import ROOT, WorkerProcess, worker_env

PY_ADD = "a = {{a}}\nb = {{b}}\nprint(a + b)\n"
NODE_UPPER = "const s = {{text}};\nconsole.log(s.toUpperCase());\n"
NUMBERS = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer", "default": 1}},
    "required": ["a"],
    "additionalProperties": False,
}
TEXT = {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 1000}},
    "required": ["text"],
}


#: One skills queue per xdist worker: the test processes share one broker, and a worker of
#: another test database would take (and drop) executions it cannot find.
SKILL_QUEUE = f"skills-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"


@pytest.fixture(autouse=True)
def _own_skill_queue(settings: Any, request: pytest.FixtureRequest) -> None:
    """Executions are nudged to this process's queue. A module that also runs executions
    inline (``INLINE_EXECUTIONS = True``) sends its other tests' nudges to a queue nobody
    consumes: its module-scoped ``skills_worker`` may still be alive and would claim them
    first (the inline ``execution_run`` then finds nothing to claim)."""
    queue = SKILL_QUEUE
    inline = getattr(request.module, "INLINE_EXECUTIONS", False)
    if inline and "skills_worker" not in request.fixturenames:
        queue = f"{SKILL_QUEUE}-inline"
    settings.SKILLHUB = {**settings.SKILLHUB, "QUEUE": queue}


def skill_worker_env(**extra: str) -> dict[str, str]:
    """The environment of a worker process of these tests (its executions go to our queue)."""
    return {**worker_env(), "LOOPWRIGHT_SKILL_QUEUE": SKILL_QUEUE, **extra}


class SkillsWorker(WorkerProcess):
    """A ``celery worker`` consuming only this test process's skills queue."""

    def _spawn(self, env: dict[str, str], log: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "orchestrator", "worker",
                "-Q", env.get("LOOPWRIGHT_SKILL_QUEUE", SKILL_QUEUE),
                "--pool", "threads", "-c", "2", "--without-gossip", "--without-mingle",
                "--without-heartbeat", "-l", "INFO", "-n", f"{self.name}@%h",
            ],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def start_skills_worker(log_dir: Path, name: str, **env: str) -> SkillsWorker:
    worker = SkillsWorker(name, log_dir, skill_worker_env(**env))
    worker.start()
    worker.wait_ready(timeout=90)
    return worker


@pytest.fixture(scope="module")
def skills_worker(
    django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SkillsWorker]:
    """One skills worker for a module's transactional tests (it polls no tables itself)."""
    with django_db_blocker.unblock():
        worker = start_skills_worker(tmp_path_factory.mktemp("skills-worker"), "skills")
    yield worker
    worker.kill()


@pytest.fixture
def make_skill(db: None) -> Callable[..., Skill]:
    def make(tool_name: str = "py_add", **fields: Any) -> Skill:
        values: dict[str, Any] = {
            "title": tool_name.replace("_", " "),
            "description": f"The {tool_name} skill",
            "code_template": PY_ADD,
            "language": "python",
            "input_schema": NUMBERS,
            "timeout_seconds": 20,
        }
        values.update(fields)
        return skill_create(actor="test", tool_name=tool_name, **values)

    return make

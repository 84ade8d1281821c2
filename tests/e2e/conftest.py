from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.invokers import create_side_effect_tables
from tests.support.workers import WorkerProcess


@pytest.fixture
def side_effects(transactional_db: None) -> None:
    create_side_effect_tables()


@pytest.fixture
def workers(tmp_path: Path, side_effects: None) -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.kill()


def start_worker(
    workers: list[WorkerProcess], tmp_path: Path, name: str, **env: str
) -> WorkerProcess:
    worker = WorkerProcess(name, tmp_path, env).start()
    workers.append(worker)
    worker.wait_ready()
    return worker

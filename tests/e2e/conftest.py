from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.chaos import ManagedProcess, beat_process, log_tails, purge_broker
from tests.support.invokers import create_side_effect_tables
from tests.support.workers import WorkerProcess


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Remember each phase's report on the item, so fixtures can tell a failed test."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def _failed(request: pytest.FixtureRequest) -> bool:
    report = getattr(request.node, "report_call", None)
    return report is None or report.failed


@pytest.fixture
def side_effects(transactional_db: None) -> None:
    create_side_effect_tables()


@pytest.fixture
def workers(
    tmp_path: Path, side_effects: None, request: pytest.FixtureRequest
) -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    if _failed(request) and started:
        print(log_tails(started))  # shown under "Captured stdout teardown"
    for worker in started:
        worker.kill()


@pytest.fixture
def procs(request: pytest.FixtureRequest) -> Iterator[list[Any]]:
    """Other processes a test starts (beat, claimers, redis-server...): killed at teardown."""
    started: list[Any] = []
    yield started
    if _failed(request) and started:
        print(log_tails(started))
    for proc in reversed(started):
        proc.kill()


@pytest.fixture
def clean_broker() -> None:
    purge_broker()


def start_worker(
    workers: list[WorkerProcess], tmp_path: Path, name: str, **env: str
) -> WorkerProcess:
    worker = WorkerProcess(name, tmp_path, env).start()
    workers.append(worker)
    worker.wait_ready(timeout=90)  # a loaded 2-core machine can take that long to boot one
    return worker


def start_beat(
    procs: list[Any], tmp_path: Path, interval: float = 1.0, **env: str
) -> ManagedProcess:
    """``celery beat`` sending the reaper every ``interval`` seconds (the real schedule)."""
    beat = beat_process(tmp_path, interval, **env)
    procs.append(beat)
    return beat

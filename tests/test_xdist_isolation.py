"""The test run's own isolation (tests/settings.py): each xdist worker has its own broker."""

from __future__ import annotations

import os

import pytest
from django.conf import settings

from tests.settings import _shift_redis_db


def test_redis_urls_move_to_the_workers_own_database() -> None:
    assert _shift_redis_db("redis://127.0.0.1:6379/2", 1) == "redis://127.0.0.1:6379/3"
    assert _shift_redis_db("redis://127.0.0.1:6379", 1) == "redis://127.0.0.1:6379/1"
    assert _shift_redis_db("redis://h:1/0?timeout=1", 2) == "redis://h:1/2?timeout=1"
    assert _shift_redis_db("filesystem://", 1) == "filesystem://"


def test_a_redis_database_beyond_the_default_count_is_refused() -> None:
    with pytest.raises(RuntimeError, match="database 16"):
        _shift_redis_db("redis://127.0.0.1:6379/15", 1)


@pytest.mark.skipif("PYTEST_XDIST_WORKER" not in os.environ, reason="runs under pytest-xdist only")
def test_each_xdist_worker_has_its_own_var_dir_and_broker() -> None:
    worker = os.environ["PYTEST_XDIST_WORKER"]
    assert settings.VAR_DIR.name == worker
    if settings.CELERY_BROKER_URL.startswith("filesystem://"):
        assert str(settings.BROKER_DIR).startswith(str(settings.VAR_DIR))

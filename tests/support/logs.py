"""The root logger's lines as JSON (``LOG_FORMAT=json``'s formatter), for a test's length."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from orchestrator.logcontext import JsonFormatter


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """What the root logger writes while the test runs, one JSON object per line (INFO up)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(min(old_level or logging.INFO, logging.INFO))
    yield out
    root.setLevel(old_level)
    root.removeHandler(handler)

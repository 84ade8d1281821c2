"""Fixtures for the model-client tests: the loopback model server and the asyncio backend."""

from __future__ import annotations

import pytest

from tests.support.model_server import make_model_server, model_server

__all__ = ["make_model_server", "model_server"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"

"""Fixtures for the model-client tests: the loopback model server, the breaker stores and clock,
and the asyncio backend."""

from __future__ import annotations

import pytest

from tests.support.breakers import clock, store
from tests.support.model_server import make_model_server, model_server

__all__ = ["clock", "make_model_server", "model_server", "store"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"

"""The observability tests' parts: real worker processes (tests/e2e/conftest.py) and a real
OpenAI-compatible model server on loopback (tests/support/model_server.py)."""

from __future__ import annotations

from tests.e2e.conftest import procs, pytest_runtest_makereport, side_effects, workers

__all__ = ["procs", "pytest_runtest_makereport", "side_effects", "workers"]

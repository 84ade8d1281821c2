from __future__ import annotations

from tests.e2e.conftest import procs, pytest_runtest_makereport, side_effects, workers
from tests.support.model_server import make_model_server, model_server

__all__ = [
    "make_model_server",
    "model_server",
    "procs",
    "pytest_runtest_makereport",
    "side_effects",
    "workers",
]

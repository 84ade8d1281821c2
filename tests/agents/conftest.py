from __future__ import annotations

from tests.support.model_server import make_model_server, model_server

__all__ = ["make_model_server", "model_server"]

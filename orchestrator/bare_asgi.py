"""Django's ASGI handler without the settings' middleware chain, for the OpenAI-compatible
endpoint at ``/v1/`` (see :mod:`orchestrator.asgi`).

Holds: a request reaches its (async) view on the event loop with no middleware thread hop;
URL resolution, the request signals and ``convert_exception_to_response`` are Django's own.
What the skipped middlewares would give these views (bearer tokens instead of sessions and
CSRF, the body bound as an OpenAI-shaped 413, the request id) the views do themselves.
"""

from __future__ import annotations

from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response


class BareASGIHandler(ASGIHandler):
    """An ASGI handler whose middleware chain is empty (``settings.MIDDLEWARE`` is not read)."""

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        get_response = self._get_response_async if is_async else self._get_response
        self._middleware_chain = convert_exception_to_response(get_response)

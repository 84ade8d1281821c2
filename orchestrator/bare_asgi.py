"""Django's ASGI handler without the settings' middleware chain, for the OpenAI-compatible
endpoint at ``/v1/`` (see :mod:`orchestrator.asgi`).

Holds: a request reaches its (async) view on the event loop with no middleware thread hop;
URL resolution, the request signals and ``convert_exception_to_response`` are Django's own.
What the skipped middlewares would give these views (bearer tokens instead of sessions and
CSRF, the body bound as an OpenAI-shaped 413, the request id) the views do themselves.
"""

from __future__ import annotations

from typing import Any

from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response


class BareASGIHandler(ASGIHandler):
    """An ASGI handler whose middleware chain is empty (``settings.MIDDLEWARE`` is not read)."""

    def load_middleware(self, is_async: bool = False) -> None:
        # What BaseHandler.load_middleware sets, with no middleware (django-stubs omits them).
        handler: Any = self
        handler._view_middleware = []
        handler._template_response_middleware = []
        handler._exception_middleware = []
        get_response = handler._get_response_async if is_async else handler._get_response
        handler._middleware_chain = convert_exception_to_response(get_response)

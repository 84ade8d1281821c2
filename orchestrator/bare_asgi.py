"""Django's ASGI handler without the settings' middleware chain, for the OpenAI-compatible
endpoint at ``/v1/`` (see :mod:`orchestrator.asgi`).

Holds: a request reaches its (async) view on the event loop with no middleware thread hop;
URL resolution, the request signals and ``convert_exception_to_response`` are Django's own.
What the skipped middlewares would give these views (bearer tokens instead of sessions and
CSRF, the body bound as an OpenAI-shaped 413, the request id) the views do themselves.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response

#: True while a request is served by :class:`BareASGIHandler`.
BARE_REQUEST: ContextVar[bool] = ContextVar("bare_request", default=False)


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

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # No per-request ThreadSensitiveContext: the views do their database work on their own
        # threads, and Django's few sync calls (the request signals) share asgiref's one.
        if scope["type"] != "http":
            raise ValueError(f"Only HTTP is served here, not {scope['type']}.")
        BARE_REQUEST.set(True)
        await self.handle(scope, receive, send)

"""Django's ASGI handler without the settings' middleware chain and the request signals, for
the OpenAI-compatible endpoint at ``/v1/`` (see :mod:`orchestrator.asgi`).

Holds: a request reaches its (async) view on the event loop with no thread hop; URL resolution,
``convert_exception_to_response``, the disconnect watch and the response's sending are Django's
own. What the skipped middlewares would give these views (bearer tokens instead of sessions and
CSRF, the body bound as an OpenAI-shaped 413, the request id) the views do themselves. The
request signals' receivers (Django's per-thread connection and cache housekeeping, sent on a
worker thread) are not run: these views use no per-request thread; their database threads
refresh their own connections (:mod:`orchestrator.dbpool`).
"""

from __future__ import annotations

import asyncio
import contextlib
from contextvars import ContextVar
from typing import Any

from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpResponseBase
from django.urls import set_script_prefix

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
        # No per-request ThreadSensitiveContext: nothing here runs on Django's request thread.
        if scope["type"] != "http":
            raise ValueError(f"Only HTTP is served here, not {scope['type']}.")
        BARE_REQUEST.set(True)
        await self.handle(scope, receive, send)

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        """``ASGIHandler.handle`` without ``request_started`` and ``request_finished``."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:  # the client left before its body arrived
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            if error_response is not None:
                await self.send_response(error_response, send)
                _close(error_response)
            return

        async def process_request() -> HttpResponseBase:
            response = await self.run_get_response(request)
            with contextlib.suppress(asyncio.CancelledError):  # the client left while sent
                await self.send_response(response, send)
            return response

        # As Django: a disconnect while the response is made or sent cancels it.
        watch = asyncio.create_task(self.listen_for_disconnect(receive))
        work = asyncio.create_task(process_request())
        try:
            await asyncio.wait([watch, work], return_when=asyncio.FIRST_COMPLETED)
            for task in (watch, work):
                if task.done():
                    with contextlib.suppress(RequestAborted):
                        task.result()
                else:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if not work.cancelled():
                _close(work.result())
        finally:
            body_file.close()


def _close(response: HttpResponseBase) -> None:
    """``response.close()`` without the ``request_finished`` signal."""
    closers: Any = response._resource_closers  # type: ignore[attr-defined]
    for closer in closers:
        with contextlib.suppress(Exception):
            closer()
    closers.clear()
    response.closed = True

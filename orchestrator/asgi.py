"""One ASGI app served by uvicorn: the Skill Hub's MCP server at ``/mcp``, the OpenAI-compatible
endpoint at ``/v1/`` (Django without its middleware chain, :mod:`orchestrator.bare_asgi`: the
endpoint's first byte is not held up by session, CSRF and message middlewares it never uses),
patterns served as A2A agents at ``/a2a/<key>`` (:mod:`a2a_server.asgi`), and Django (API, UI,
admin) for everything else, its requests on long-lived threads
(:mod:`orchestrator.request_threads`).

A Starlette app routes between them because the MCP SDK's streamable HTTP transport needs its
session manager running for the app's whole life: the lifespan below enters the endpoint's
``running()``, which runs ``session_manager.run()`` (a mounted sub-app's own lifespan never
runs, which would leave the SDK's task group uninitialised). Serve with uvicorn (its default
``--lifespan auto`` runs it).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any, cast

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
django.setup(set_prefix=False)  # what get_asgi_application() does before its handler

# Django's handler, its requests on long-lived threads that keep their database connections.
from orchestrator.request_threads import PooledThreadsASGIHandler  # noqa: E402

django_application = PooledThreadsASGIHandler()

# Django must be set up (above) before the Skill Hub's modules are imported.
from django.urls import get_resolver  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.routing import Mount, Route  # noqa: E402

from a2a_server.asgi import a2a_asgi  # noqa: E402
from orchestrator.bare_asgi import BareASGIHandler  # noqa: E402
from orchestrator.heap import freeze_startup_heap  # noqa: E402
from skillhub.mcp import mcp_asgi  # noqa: E402

mcp_application, mcp_endpoint = mcp_asgi()
openai_application = BareASGIHandler()
a2a_application = a2a_asgi()


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    async with mcp_endpoint.running():
        # The URLconf imports every view, serializer and form now, not at the first requests;
        # then no full collection walks what the app loaded again.
        get_resolver().url_patterns  # noqa: B018
        freeze_startup_heap()
        yield


application = Starlette(
    routes=[
        Route("/mcp", endpoint=mcp_application, methods=["GET", "POST", "DELETE"]),
        Route("/v1/{rest:path}", endpoint=openai_application),
        Mount("/a2a", app=a2a_application),
        Mount("/", app=cast(Any, django_application)),
    ],
    lifespan=lifespan,
)

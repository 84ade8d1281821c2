"""HTML error pages for the UI, and error handlers that answer each client in its own language.

The UI's own views render these pages themselves (see :mod:`frontend.access`), so an unknown run
or a refused action is an HTML page even while the project's root handlers answer
``application/problem+json``. The ``handler*`` functions below are content-negotiating
replacements for the root URLconf's handlers: HTML for a browser on a UI path, problem+json for
the API (``/api/…``), for ``/mcp`` and for clients that do not ask for HTML.
"""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template import loader

from orchestrator import errors as api_errors

logger = logging.getLogger(__name__)
_MACHINE_PREFIXES = ("/api/", "/mcp", "/v1/", "/healthz", "/readyz", "/metrics")


def error_page(request: HttpRequest, status: int, title: str, detail: str) -> HttpResponse:
    """The UI's error page (layout with navigation, so the operator can go on from here)."""
    context = {"status": status, "title": title, "detail": detail}
    return render(request, "frontend/errors/error.html", context, status=status)


def server_error_page(request: HttpRequest) -> HttpResponse:
    """A 500 page that needs neither the database nor the session: they may be what failed."""
    html = loader.get_template("frontend/errors/500.html").render(
        {"request_id": getattr(request, "request_id", "")}
    )
    return HttpResponse(html, status=500)


def wants_html(request: HttpRequest) -> bool:
    """A browser asking for a UI page (not the API, not a script that accepts anything)."""
    if request.path.startswith(_MACHINE_PREFIXES):
        return False
    return "text/html" in request.headers.get("Accept", "")


def handler400(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if not wants_html(request):
        return api_errors.handler400(request, exception)
    return error_page(request, 400, "Bad request", "The request was malformed.")


def handler403(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if not wants_html(request):
        return api_errors.handler403(request, exception)
    return error_page(request, 403, "Not allowed", "Your role does not allow this.")


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if not wants_html(request):
        return api_errors.handler404(request, exception)
    return error_page(request, 404, "Not found", "There is no page at this address.")


def handler500(request: HttpRequest) -> HttpResponse:
    if not wants_html(request):
        return api_errors.handler500(request)
    logger.error(
        "unhandled error on %s (request id %s)", request.path, getattr(request, "request_id", "-")
    )
    return server_error_page(request)

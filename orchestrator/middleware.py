"""Request ids, and the transport-level bounds every request meets before any view.

:class:`RequestIdMiddleware`: taken from ``X-Request-ID`` when sane, else generated; echoed on
the response. :class:`BoundedRequestMiddleware`: a body declared larger than
``LOOPWRIGHT_MAX_BODY_BYTES`` is a 413 problem naming the limit (bodies without a length are
bounded by the parser); a NUL character in a query parameter or form field is a 400 problem
naming it; a ``RecursionError`` out of a view is a 400 problem, never a 500.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict

from orchestrator.errors import (
    PROBLEM_CONTENT_TYPE,
    TOO_DEEP,
    DomainError,
    InvalidInput,
    PayloadTooLarge,
    problem,
)
from orchestrator.jsonlimits import MAX_DEPTH, pointer, safe_text
from orchestrator.logcontext import REQUEST_ID

logger = logging.getLogger(__name__)
_SAFE_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_URLENCODED = "application/x-www-form-urlencoded"  # multipart is left whole for its view


def request_id_of(request: HttpRequest) -> str:
    """The request's id: its ``X-Request-ID`` when sane (at most 64 of ``A-Za-z0-9._-``), else
    a new one."""
    incoming = request.headers.get("X-Request-ID", "")
    return incoming if _SAFE_ID.match(incoming) else uuid.uuid4().hex


class RequestIdMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request.request_id = request_id_of(request)  # type: ignore[attr-defined]
        token = REQUEST_ID.set(request.request_id)  # type: ignore[attr-defined]
        try:
            response = self.get_response(request)
        finally:
            REQUEST_ID.reset(token)
        response["X-Request-ID"] = request.request_id  # type: ignore[attr-defined]
        return response


def domain_response(request: HttpRequest, exc: DomainError) -> JsonResponse:
    """``exc`` as a problem+json response (outside DRF's exception handler)."""
    body = problem(exc.status_code, exc.problem_type, exc.title, exc.detail, request, **exc.extra)
    return JsonResponse(body, status=exc.status_code, content_type=PROBLEM_CONTENT_TYPE)


def _nul_problem(where: str, params: QueryDict) -> InvalidInput | None:
    for key, values in params.lists():
        bad = "\x00" in key or any("\x00" in value for value in values)
        if bad:
            name = safe_text(key)
            detail = f"The {where} {name!r} contains a NUL character (\\u0000)."
            item = {"pointer": pointer([key]), "detail": detail, "code": "null_character"}
            return InvalidInput(detail, errors=[item])
    return None


def declared_length(request: HttpRequest) -> int:
    """The body length the request declares (0 when absent or malformed)."""
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0


class BoundedRequestMiddleware:
    """Body size (413), NUL characters in parameters and form fields (400), and no
    ``RecursionError`` escaping as a 500."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = int(settings.LOOPWRIGHT_MAX_BODY_BYTES)
        if declared_length(request) > limit:
            return domain_response(request, PayloadTooLarge(limit))
        refused = _nul_problem("query parameter", request.GET)
        if refused is None and request.method == "POST" and request.content_type == _URLENCODED:
            refused = _nul_problem("form field", request.POST)
        if refused is not None:
            return domain_response(request, refused)
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, RecursionError):
            return None
        logger.warning("RecursionError answered 400 on %s", request.path)
        item = {"pointer": "/", "detail": TOO_DEEP, "code": "too_deep"}
        return domain_response(request, InvalidInput(TOO_DEEP, errors=[item], max_depth=MAX_DEPTH))

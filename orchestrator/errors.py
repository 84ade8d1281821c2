"""One error shape for the whole API: RFC 9457 ``application/problem+json``.

Domain code raises :class:`DomainError` subclasses; DRF errors and Django's 404/500 are mapped
to the same shape. Field errors are listed as ``errors: [{pointer, detail, code}]`` with JSON
Pointers, and every problem carries the request id.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Model
from django.http import Http404, HttpRequest, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from orchestrator.jsonlimits import MAX_DEPTH, JsonRefused, pointer, safe_text

logger = logging.getLogger(__name__)
PROBLEM_CONTENT_TYPE = "application/problem+json"
PROBLEM_BASE = "/problems/"
TOO_DEEP = "The input is nested too deeply to process."
#: The 401 detail of a request that sent no credentials at all (no token, no session).
NO_CREDENTIALS = (
    "No credentials: send 'Authorization: Bearer <API token>' (manage.py create_api_token) "
    "or sign in."
)


class DomainError(Exception):
    """A refusal the client can act on. Subclasses set status, type and title."""

    status_code: int = status.HTTP_400_BAD_REQUEST
    problem_type = "bad-request"
    title = "Bad request"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class NotFound(DomainError):
    status_code = status.HTTP_404_NOT_FOUND
    problem_type = "not-found"
    title = "Not found"


class Conflict(DomainError):
    status_code = status.HTTP_409_CONFLICT
    problem_type = "conflict"
    title = "Conflict"


class InvalidInput(DomainError):
    """Bad input found by a service; ``errors`` is a list of {pointer, detail, code}."""

    status_code = status.HTTP_400_BAD_REQUEST
    problem_type = "validation-error"
    title = "Invalid input"


def invalid_fields(errors: list[dict[str, str]]) -> InvalidInput:
    """An :class:`InvalidInput` of ``errors`` ({pointer, detail, code}), detailed by the first."""
    detail = errors[0]["detail"] if len(errors) == 1 else f"{len(errors)} fields are invalid."
    return InvalidInput(detail, errors=errors)


def full_clean_or_invalid(instance: Model, *, prefix: str = "") -> None:
    """``instance.full_clean()``; its field errors as :class:`InvalidInput` with pointers
    (``prefix/field``)."""
    try:
        instance.full_clean()
    except ValidationError as exc:
        errors = [
            {"pointer": f"{prefix}/{field}" if field != "__all__" else prefix or "/", "detail": msg}
            for field, messages in exc.message_dict.items()
            for msg in messages
        ]
        raise invalid_fields([{**error, "code": "invalid"} for error in errors]) from None


class PayloadTooLarge(DomainError):
    """A request body over ``LOOPWRIGHT_MAX_BODY_BYTES``; the problem names the limit."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    problem_type = "payload-too-large"
    title = "Request body too large"

    def __init__(self, limit_bytes: int) -> None:
        super().__init__(
            f"The request body is larger than {limit_bytes} bytes, the limit "
            "(LOOPWRIGHT_MAX_BODY_BYTES).",
            limit_bytes=limit_bytes,
        )


def refused_json(exc: JsonRefused, prefix: str = "") -> InvalidInput:
    """The 400 for JSON input refused by :mod:`orchestrator.jsonlimits` (depth, NUL,
    surrogates, non-finite numbers); ``prefix`` is the pointer of where the JSON sits."""
    extra: dict[str, Any] = {}
    if exc.code == "too_deep":
        extra["max_depth"] = MAX_DEPTH
    where = (prefix + exc.pointer) or "/"
    return InvalidInput(
        exc.detail, errors=[{"pointer": where, "detail": exc.detail, "code": exc.code}], **extra
    )


def _pointer(path: list[str | int]) -> str:
    return pointer(path) or "/"


def flatten_field_errors(data: Any, path: list[str | int] | None = None) -> list[dict[str, str]]:
    """Turn DRF's nested error dict/list into [{pointer, detail, code}]."""
    path = path or []
    out: list[dict[str, str]] = []
    if isinstance(data, dict):
        for key, value in data.items():
            sub = path if key in ("non_field_errors", "detail") else [*path, key]
            out.extend(flatten_field_errors(value, sub))
    elif isinstance(data, list):
        if all(isinstance(x, (str, exceptions.ErrorDetail)) for x in data):
            for item in data:
                code = getattr(item, "code", "invalid")
                detail = safe_text(str(item))
                out.append({"pointer": _pointer(path), "detail": detail, "code": str(code)})
        else:
            for index, value in enumerate(data):
                out.extend(flatten_field_errors(value, [*path, index]))
    else:
        code = getattr(data, "code", "invalid")
        out.append({"pointer": _pointer(path), "detail": safe_text(str(data)), "code": str(code)})
    return out


def problem(
    status_code: int,
    problem_type: str,
    title: str,
    detail: str,
    request: HttpRequest | None = None,
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": PROBLEM_BASE + problem_type,
        "title": title,
        "status": status_code,
        "detail": safe_text(detail),
    }
    if request is not None:
        body["instance"] = request.path
        request_id = getattr(request, "request_id", None)
        if request_id:
            body["request_id"] = request_id
    body.update(extra)
    return body


_DRF_TYPES: dict[type[Exception], tuple[str, str]] = {
    exceptions.NotAuthenticated: ("not-authenticated", "Authentication required"),
    exceptions.AuthenticationFailed: ("authentication-failed", "Authentication failed"),
    exceptions.PermissionDenied: ("forbidden", "Forbidden"),
    exceptions.NotFound: ("not-found", "Not found"),
    exceptions.MethodNotAllowed: ("method-not-allowed", "Method not allowed"),
    exceptions.ParseError: ("malformed-request", "Malformed request body"),
    exceptions.UnsupportedMediaType: ("unsupported-media-type", "Unsupported media type"),
    exceptions.NotAcceptable: ("not-acceptable", "Not acceptable"),
    exceptions.Throttled: ("throttled", "Too many requests"),
}


def _drf_problem(exc: exceptions.APIException, request: HttpRequest | None) -> dict[str, Any]:
    if isinstance(exc, exceptions.ValidationError):
        errors = flatten_field_errors(exc.detail)
        detail = errors[0]["detail"] if len(errors) == 1 else f"{len(errors)} fields are invalid."
        return problem(
            exc.status_code, "validation-error", "Invalid input", detail, request, errors=errors
        )
    problem_type, title = "error", "Error"
    for cls, (ptype, ptitle) in _DRF_TYPES.items():
        if isinstance(exc, cls):
            problem_type, title = ptype, ptitle
            break
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if isinstance(exc, exceptions.NotAuthenticated) and detail == exc.default_detail:
        detail = NO_CREDENTIALS
    return problem(exc.status_code, problem_type, title, str(detail), request)


def problem_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF ``EXCEPTION_HANDLER``: every error becomes a problem+json response."""
    request = context.get("request")
    django_request = getattr(request, "_request", request)
    if isinstance(exc, RecursionError):  # input deeper than some recursive code can follow
        logger.warning("RecursionError answered 400 on %s", getattr(django_request, "path", "-"))
        exc = refused_json(JsonRefused(TOO_DEEP, code="too_deep"))
    if isinstance(exc, DomainError):
        body = problem(
            exc.status_code, exc.problem_type, exc.title, exc.detail, django_request, **exc.extra
        )
        return Response(body, status=exc.status_code, content_type=PROBLEM_CONTENT_TYPE)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    response = exception_handler(exc, context)
    if response is None or not isinstance(exc, exceptions.APIException):
        return response
    response.data = _drf_problem(exc, django_request)
    response.content_type = PROBLEM_CONTENT_TYPE
    return response


def _json_problem(
    request: HttpRequest, status_code: int, ptype: str, title: str, detail: str
) -> JsonResponse:
    body = problem(status_code, ptype, title, detail, request)
    return JsonResponse(body, status=status_code, content_type=PROBLEM_CONTENT_TYPE)


def handler404(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return _json_problem(request, 404, "not-found", "Not found", "No such resource.")


def handler500(request: HttpRequest) -> JsonResponse:
    logger.error(
        "unhandled error on %s (request id %s)", request.path, getattr(request, "request_id", "-")
    )
    return _json_problem(
        request, 500, "internal-error", "Internal error", "The server failed; see its logs."
    )


def handler400(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return _json_problem(request, 400, "bad-request", "Bad request", "The request was malformed.")


def handler403(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return _json_problem(request, 403, "forbidden", "Forbidden", "Not allowed.")

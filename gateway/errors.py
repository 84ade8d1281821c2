"""Errors of the OpenAI-compatible endpoint, in OpenAI's shape.

Every refusal at ``/v1/...`` is ``{"error": {"message", "type", "param", "code"}}`` with the
status the official SDKs map to their typed exceptions (401 AuthenticationError, 403
PermissionDeniedError, 404 NotFoundError, 400 BadRequestError, 429 RateLimitError, 5xx
InternalServerError). Never problem+json here: OpenAI clients could not read it.
"""

from __future__ import annotations

from typing import Any

from django.http import JsonResponse

from orchestrator.jsonlimits import safe_text

#: status → OpenAI error type
_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_denied",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "server_error",
    502: "server_error",
    503: "server_error",
    504: "server_error",
}


class OpenAIError(Exception):
    """A refusal or failure at ``/v1/...``; :meth:`body` is OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        error_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.error_type = error_type or _TYPES.get(status, "server_error")
        self.headers = headers or {}
        #: Further top-level members of the body (``guardrail_metadata`` of a blocked input).
        self.extra: dict[str, Any] = {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": safe_text(self.message),
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            },
            **self.extra,
        }

    def response(self) -> JsonResponse:
        response = JsonResponse(self.body(), status=self.status)
        for name, value in self.headers.items():
            response[name] = value
        if self.status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="loopwright"'
        return response


def bad_request(message: str, param: str | None, code: str = "invalid_value") -> OpenAIError:
    """A 400 naming the offending field (``param``: a dotted path such as ``messages.0.role``)."""
    return OpenAIError(400, message, code=code, param=param)


def invalid_api_key() -> OpenAIError:
    return OpenAIError(
        401,
        "Invalid, expired or revoked API key: send a Loopwright API token as "
        "'Authorization: Bearer lw_...'.",
        code="invalid_api_key",
    )


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(
        404,
        f"The model {model!r} does not exist: it names no AI employee.",
        code="model_not_found",
        param="model",
    )


def permission_denied(model: str) -> OpenAIError:
    return OpenAIError(
        403,
        f"You have no grant to call the AI employee {model!r}; an admin can grant it "
        "(/api/v1/employee-grants).",
        code="permission_denied",
        param="model",
    )

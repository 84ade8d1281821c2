"""The OpenAI-compatible endpoint: ``GET /v1/models``, ``GET /v1/models/{model}`` and
``POST /v1/chat/completions``, where ``model`` is an AI employee's username and the key is a
Loopwright API token (``Authorization: Bearer lw_...``).

Plain async Django views (the answers are OpenAI-shaped, not the API's problem+json): every
refusal is ``{"error": {"message", "type", "param", "code"}}`` (:mod:`gateway.errors`). The work
is in :mod:`gateway.runner`; these views only route, and turn errors into responses. They are
served without Django's middleware chain (:mod:`orchestrator.bare_asgi`), so they bound the body
(413), echo ``X-Request-ID`` and take the caller's ``traceparent`` (:mod:`gateway.tracing`)
themselves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from functools import wraps
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from gateway import access, runner, tracing
from gateway.errors import OpenAIError
from gateway.validation import CompletionRequest, chat_request, parse_body
from orchestrator.dbpool import db_call
from orchestrator.logcontext import REQUEST_ID
from orchestrator.middleware import declared_length, request_id_of

logger = logging.getLogger(__name__)
View = Callable[..., Coroutine[Any, Any, HttpResponseBase]]


def openai_view(*methods: str) -> Callable[[View], View]:
    """Allow ``methods`` only, exempt from CSRF (bearer tokens, no cookies), answer every
    error in OpenAI's shape (500 for anything unexpected, logged), and echo the request id."""

    def decorate(view: View) -> View:
        @wraps(view)
        async def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            request_id = request_id_of(request)
            request.request_id = request_id  # type: ignore[attr-defined]
            # This request's log lines name it and its trace; the chat's tasks copy them when
            # made, and the caller's context is given back (a test client runs views inline).
            marks = REQUEST_ID.set(request_id), *tracing.trace_marks()
            try:
                request.trace = tracing.chat_trace(request.headers.get("traceparent"))  # type: ignore[attr-defined]
                response = await _answer(view, methods, request, *args, **kwargs)
            finally:
                tracing.trace_marks_reset(marks)
            response["X-Request-ID"] = request.request_id  # type: ignore[attr-defined]
            return response

        return csrf_exempt(wrapped)

    return decorate


async def _answer(
    view: View, methods: tuple[str, ...], request: HttpRequest, *args: Any, **kwargs: Any
) -> HttpResponseBase:
    try:
        if request.method not in methods:
            raise OpenAIError(
                405,
                f"{request.method} is not allowed here; use {' or '.join(methods)}.",
                code="method_not_allowed",
                headers={"Allow": ", ".join(methods)},
            )
        if declared_length(request) > int(settings.LOOPWRIGHT_MAX_BODY_BYTES):
            raise RequestDataTooBig
        return await view(request, *args, **kwargs)
    except OpenAIError as exc:
        return exc.response()
    except RequestDataTooBig:
        limit = int(settings.LOOPWRIGHT_MAX_BODY_BYTES)
        message = f"The request body is larger than this server accepts ({limit} bytes)."
        return OpenAIError(413, message, code="request_too_large").response()
    except RecursionError:
        return OpenAIError(400, "The input is nested too deeply.", code="too_deep").response()
    except Exception:
        logger.exception("OpenAI endpoint failed on %s", request.path)
        error = OpenAIError(500, "The server failed; see its logs.", code="internal_error")
        return error.response()


def _authorization(request: HttpRequest) -> str:
    return request.headers.get("Authorization", "")


@openai_view("GET")
async def models(request: HttpRequest) -> HttpResponseBase:
    """The employees the caller may use, as OpenAI model objects."""
    found = await db_call(access.models_of, _authorization(request))
    return JsonResponse({"object": "list", "data": found})


@openai_view("GET")
async def model(request: HttpRequest, model: str) -> HttpResponseBase:
    """One employee the caller may use (404 unknown, 403 not granted)."""
    found = await db_call(access.model_of, _authorization(request), model)
    return JsonResponse(found)


@openai_view("POST")
async def chat_completions(request: HttpRequest) -> HttpResponseBase:
    """Run the employee named by ``model`` on the messages: a ``chat.completion`` object, or
    with ``stream: true`` an SSE stream of ``chat.completion.chunk`` events ending in
    ``data: [DONE]``."""
    # One trip to the database thread: the caller (401 before anything about the body), then
    # the body's refusal if any, then the employee (404, 403) and what its chat needs.
    try:
        body: CompletionRequest | OpenAIError = chat_request(parse_body(request.body))
    except OpenAIError as exc:
        body = exc
    prepared = await db_call(access.prepare_chat, _authorization(request), body)
    chat = runner.Chat(prepared.request, prepared, request.trace)  # type: ignore[attr-defined]
    if not prepared.request.stream:
        return JsonResponse(await runner.complete(chat), json_dumps_params={"ensure_ascii": False})
    events = await runner.stream_open(chat)
    response = StreamingHttpResponse(events, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response

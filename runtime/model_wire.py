"""The Chat Completions wire format: the request body, the parsed completion, and what an
error answer means (retry, fail over, or stop). Every error text is redacted before it is kept."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

import httpx2

from runtime import http_lite
from runtime.model_config import EndpointConfig, ModelParams
from runtime.secrets import Secret, redact
from runtime.streaming import usage_from_wire
from runtime.types import ChatRequest, ChatResponse, ContextOverflow, ToolCall

MAX_ERROR_TEXT = 500
_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL)

ErrorKind = Literal["transient", "endpoint", "request"]

_OVERFLOW_MARKERS = (
    "context_length_exceeded",
    "context_window_exceeded",
    "maximum context length",
    "context length",
    "too many tokens",
    "prompt is too long",
    "input is too long",
    "reduce the length",
)


class EndpointError(Exception):
    """One endpoint's failure, already redacted. ``kind`` decides retry and failover."""

    def __init__(
        self,
        kind: ErrorKind,
        detail: str,
        *,
        retry_after: float | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(detail)
        self.kind: ErrorKind = kind
        self.detail = detail
        self.retry_after = retry_after
        #: The HTTP status the endpoint answered, when it answered one.
        self.status = status
        #: Retries ran out on a transient failure: the breaker trips.
        self.exhausted = False
        #: Stop walking the chain (the request is wrong, or output already went out live).
        self.stop = kind == "request"
        self.endpoint = ""


def is_context_overflow(status: int, text: str) -> bool:
    """A 400/413/422 whose code or message says the prompt does not fit the context window."""
    lowered = text.lower()
    return status in (400, 413, 422) and any(marker in lowered for marker in _OVERFLOW_MARKERS)


def classify_status(status: int) -> ErrorKind:
    if status in (408, 429) or status >= 500:
        return "transient"
    if status in (401, 403, 404):
        return "endpoint"
    return "request"


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """The seconds form of ``Retry-After`` (the HTTP-date form falls back to our backoff)."""
    value = headers.get("retry-after", "").strip()
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def error_from_response(status: int, text: str, headers: Mapping[str, str]) -> Exception:
    snippet = " ".join(text.split())[:MAX_ERROR_TEXT]
    if is_context_overflow(status, text):
        return ContextOverflow(f"HTTP {status}: {snippet}")
    kind = classify_status(status)
    retry_after = parse_retry_after(headers)
    return EndpointError(kind, f"HTTP {status}: {snippet}", retry_after=retry_after, status=status)


def error_from_payload(error: Any, key: Secret | None) -> Exception:
    """An ``{"error": ...}`` object inside a 200 body or a stream chunk."""
    text = redact(json.dumps(error), key)
    code = error.get("code") if isinstance(error, dict) else None
    status = code if isinstance(code, int) and 400 <= code < 600 else 502
    if status >= 500 and any(marker in text.lower() for marker in _OVERFLOW_MARKERS):
        status = 400  # an overflow reported without a usable status code
    return error_from_response(status, text, {})


def _schema_wrapper(schema: dict[str, Any]) -> dict[str, Any]:
    if "schema" in schema and "name" in schema:
        return schema  # already the {"name", "schema", "strict"?} wrapper
    name = str(schema.get("title") or "response").replace(" ", "_")[:64]
    return {"name": name, "schema": schema}


def _response_format(request: ChatRequest, params: ModelParams) -> dict[str, Any] | None:
    from_request = request.response_format != "text"
    kind = request.response_format if from_request else params.response_format
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = request.json_schema if from_request else params.json_schema
        return {"type": "json_schema", "json_schema": _schema_wrapper(schema or {})}
    return None


def build_body(request: ChatRequest, target: EndpointConfig) -> dict[str, Any]:
    """The Chat Completions request body for ``target``."""
    body: dict[str, Any] = {"model": target.model, "messages": request.messages}
    body.update(target.params.to_wire())
    if request.max_tokens:
        body["max_completion_tokens"] = request.max_tokens
    if request.tools:
        body["tools"] = request.tools
        if request.tool_choice:
            body["tool_choice"] = request.tool_choice
    response_format = _response_format(request, target.params)
    if response_format:
        body["response_format"] = response_format
    body.update(target.params.extra_fields)
    if request.temperature is not None:  # the caller's value wins for this request
        body["temperature"] = request.temperature
    if request.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def _tool_call_from_wire(index: int, raw: dict[str, Any]) -> ToolCall:
    function = raw.get("function") or {}
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        # Some servers send parsed objects; the loop validates JSON text, so re-encode.
        arguments = "" if arguments is None else json.dumps(arguments)
    return ToolCall(
        id=str(raw.get("id") or f"call_{index}"),
        name=str(function.get("name") or ""),
        arguments=arguments,
    )


def _text(content: Any) -> str:
    """Message content as text (some servers send a list of content parts)."""
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


def parse_completion(data: Any, target: EndpointConfig) -> ChatResponse:
    """A non-streaming completion body → :class:`ChatResponse` (raises on a malformed body)."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not choices or not isinstance(choices[0], dict):
        raise EndpointError("transient", "malformed completion: no choices")
    message = choices[0].get("message") or {}
    usage = usage_from_wire(data.get("usage") or {})
    return ChatResponse(
        content=_text(message.get("content")),
        tool_calls=[
            _tool_call_from_wire(i, call) for i, call in enumerate(message.get("tool_calls") or [])
        ],
        reasoning_content=message.get("reasoning_content") or message.get("reasoning") or "",
        usage=usage,
        finish_reason=str(choices[0].get("finish_reason") or ""),
        model=str(data.get("model") or target.model),
        endpoint=target.name,
        cost=target.cost(usage),
    )


def parse_response(
    response: httpx2.Response | http_lite.Response, target: EndpointConfig, key: Secret | None
) -> ChatResponse:
    if response.status_code >= 300:
        raise error_from_response(
            response.status_code, redact(response.text, key), response.headers
        )
    try:
        data = response.json()
    except ValueError:
        raise EndpointError("transient", "malformed completion: body is not JSON") from None
    if isinstance(data, dict) and data.get("error"):
        raise error_from_payload(data["error"], key)
    return parse_completion(data, target)


def apply_keep_think(response: ChatResponse, *, keep: bool, text_format: bool) -> ChatResponse:
    """The answer text as ``keepThink`` wants it (docs/model-client.md). False: a leading
    ``<think>…</think>`` block leaves the text for ``reasoning_content``. True (a text answer
    without tool calls only): the reasoning the endpoint sent apart goes in front of the text
    as a ``<think>`` block; text that already starts with one is kept as it is."""
    if keep:
        content = response.content
        if not text_format or response.tool_calls or not response.reasoning_content:
            return response
        if content.lstrip().startswith("<think>"):
            return response
        return replace(response, content=f"<think>{response.reasoning_content}</think>{content}")
    match = _THINK.match(response.content)
    if match is None:
        return response
    thought = match.group(1).strip()
    reasoning = "\n".join(part for part in (response.reasoning_content, thought) if part)
    return replace(response, content=response.content[match.end() :], reasoning_content=reasoning)

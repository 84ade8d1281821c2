"""The OpenAI-compatible model client: retries, failover, circuit breaking and streaming.

One :meth:`OpenAICompatibleClient.complete` call is one model step of the tool loop. It walks
the endpoint chain (the primary, then its failover endpoints by priority):

1. The endpoint's circuit breaker admits the call, refuses it (cooling down: go straight to the
   next endpoint) or makes it the single half-open probe (one attempt, no retries).
2. Transient failures (429, 408, 5xx, connection errors, timeouts, malformed bodies) are retried
   with bounded exponential backoff and jitter, honouring ``Retry-After`` (seconds, capped).
   Exhausting the retries trips the breaker and moves on to the next endpoint.
3. A recognised context overflow raises :class:`ContextOverflow` at once: resending the same
   overflowing context is pointless; the loop compacts and re-issues.
4. Authorization and not-found answers (401/403/404) are not retried but fail over (another
   endpoint has other credentials); any other 4xx means the request itself is wrong and fails
   at once with ``ModelCallFailed(retryable=False)``.

When every endpoint failed, :class:`ModelCallFailed` says whether a later retry may help.
The API key is read from the environment on every call (only a variable the secret rule allows,
:func:`secrets.check_secret_name`) and masked in every message. Every connection goes through
the outbound guard (:mod:`runtime.outbound`): a refused address fails the endpoint
without a request.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import random
import ssl
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx2
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from runtime import http_lite, outbound, outbound_http
from runtime.breaker import CircuitAdmission, CircuitBreaker, Verdict
from runtime.outbound import OutboundPolicy
from runtime.secrets import (
    Secret,
    SecretNotAllowed,
    SecretRule,
    api_key_from_env,
    current_secret_rule,
    redact,
)
from runtime.streaming import (
    DEFAULT_AUTO_WINDOW_SECONDS,
    RoutedAsPlainText,
    StreamAccumulator,
    StreamMode,
    StreamRouter,
    TextCallback,
    route_stream,
    usage_from_wire,
)
from runtime.types import (
    ChatRequest,
    ChatResponse,
    ContextOverflow,
    ModelCallFailed,
    ModelClient,
    ToolCall,
    Usage,
)

logger = logging.getLogger(__name__)

# httpcore's DEBUG trace prints response headers verbatim, and providers and proxies do echo
# credentials back in headers; a DEBUG log level must not turn that into a leaked key. Pin the
# transport trace to INFO unless an operator configured that logger explicitly.
_transport_logger = logging.getLogger("httpcore2")
if _transport_logger.level == logging.NOTSET:
    _transport_logger.setLevel(logging.INFO)

Provider = Literal["openai", "scripted"]
RESERVED_BODY_KEYS = frozenset(
    {"model", "messages", "tools", "tool_choice", "stream", "stream_options"}
)
MAX_ERROR_TEXT = 500


# --- configuration ------------------------------------------------------------------------------


class ModelParams(BaseModel):
    """LLM parameters of spec/001 (camelCase on the API; unset means the provider's default)."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_by_alias=True, validate_by_name=True
    )

    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1, alias="topP")
    frequency_penalty: float | None = Field(default=None, ge=0, le=1, alias="frequencyPenalty")
    presence_penalty: float | None = Field(default=None, ge=0, le=1, alias="presencePenalty")
    #: 0 = the model's default. Sent as ``max_completion_tokens``.
    max_tokens: int | None = Field(default=None, ge=0, alias="maxTokens")
    stop: list[str] | None = Field(default=None, max_length=16)
    response_format: Literal["text", "json_object", "json_schema"] = Field(
        default="text", alias="responseFormat"
    )
    json_schema: dict[str, Any] | None = Field(default=None, alias="jsonSchema")
    #: Merged into the request body last (provider-specific knobs such as reasoning_effort).
    extra_fields: dict[str, Any] = Field(default_factory=dict, alias="extraFields")

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("json_schema", mode="before")
    @classmethod
    def _schema_from_text(cls, value: Any) -> Any:
        # spec/001 carries jsonSchema as a string; accept that and objects alike.
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError:
                raise ValueError("jsonSchema is not valid JSON") from None
        return value

    @field_validator("extra_fields")
    @classmethod
    def _no_reserved_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        clash = sorted(RESERVED_BODY_KEYS & value.keys())
        if clash:
            raise ValueError(f"extraFields may not set {', '.join(clash)}")
        return value

    @model_validator(mode="after")
    def _schema_when_needed(self) -> ModelParams:
        if self.response_format == "json_schema" and not self.json_schema:
            raise ValueError("responseFormat json_schema needs a jsonSchema")
        return self

    def to_api(self) -> dict[str, Any]:
        """The stored / API form: camelCase, only what was set."""
        return self.model_dump(by_alias=True, exclude_unset=True)

    def merged(self, override: ModelParams | None) -> ModelParams:
        """These params with every field that ``override`` sets replacing ours."""
        if override is None:
            return self
        return ModelParams.model_validate(self.to_api() | override.to_api())

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        wire_names = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "stop": self.stop,
        }
        body.update({name: value for name, value in wire_names.items() if value is not None})
        if self.max_tokens:
            body["max_completion_tokens"] = self.max_tokens
        return body


@dataclass(frozen=True)
class EndpointConfig:
    """Everything a call needs about one endpoint, with no database behind it.

    ``failover`` holds the resolved failover endpoints in priority order (their own failover
    lists are not followed). Prices are per token, in the operator's currency.
    """

    name: str
    provider: Provider = "openai"
    base_url: str = ""
    model: str = ""
    api_key_env: str = ""
    params: ModelParams = field(default_factory=ModelParams)
    context_window: int = 128_000
    input_price: float = 0.0
    output_price: float = 0.0
    max_retries: int = 3
    timeout_seconds: float = 60.0
    circuit_cooldown_seconds: float = 60.0
    failover: tuple[EndpointConfig, ...] = ()
    #: For the scripted provider: a built-in script name or a path to a JSON script.
    script: str = "demo"

    def cost(self, usage: Usage) -> float:
        return usage.prompt_tokens * self.input_price + usage.completion_tokens * self.output_price

    @property
    def breaker_key(self) -> str:
        return f"model-endpoint:{self.name}"

    @property
    def probe_lease(self) -> float:
        """How long a half-open probe may take before another caller may take it over."""
        return max(60.0, 2 * self.timeout_seconds)

    def chain(self) -> tuple[EndpointConfig, ...]:
        return (self, *self.failover)


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff between attempts on one endpoint: exponential, bounded, with jitter."""

    base_delay: float = 0.5
    max_delay: float = 8.0
    #: ``Retry-After`` is honoured up to this many seconds (a longer wait is better spent on
    #: a failover endpoint or a later retry of the whole step).
    max_retry_after: float = 30.0

    def delay(self, retry: int, retry_after: float | None, rng: random.Random) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after)
        ceiling = min(self.max_delay, self.base_delay * 2**retry)
        # "Equal jitter": never less than half the step, so retries still back off, but spread
        # so that many workers hit by the same outage do not retry in lockstep.
        return ceiling / 2 + rng.uniform(0, ceiling / 2)


# --- errors -------------------------------------------------------------------------------------

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

    def __init__(self, kind: ErrorKind, detail: str, *, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.kind: ErrorKind = kind
        self.detail = detail
        self.retry_after = retry_after
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


def _error_from_response(status: int, text: str, headers: Mapping[str, str]) -> Exception:
    snippet = " ".join(text.split())[:MAX_ERROR_TEXT]
    if is_context_overflow(status, text):
        return ContextOverflow(f"HTTP {status}: {snippet}")
    kind = classify_status(status)
    return EndpointError(kind, f"HTTP {status}: {snippet}", retry_after=parse_retry_after(headers))


def _error_from_payload(error: Any, key: Secret | None) -> Exception:
    """An ``{"error": ...}`` object inside a 200 body or a stream chunk."""
    text = redact(json.dumps(error), key)
    code = error.get("code") if isinstance(error, dict) else None
    status = code if isinstance(code, int) and 400 <= code < 600 else 502
    if status >= 500 and any(marker in text.lower() for marker in _OVERFLOW_MARKERS):
        status = 400  # an overflow reported without a usable status code
    return _error_from_response(status, text, {})


# --- wire format --------------------------------------------------------------------------------


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


# --- the client ---------------------------------------------------------------------------------


class OpenAICompatibleClient:
    """:class:`ModelClient` for any OpenAI-compatible Chat Completions endpoint.

    One instance serves one employee (or one request): the streaming detection mode can be
    upgraded to ``drain`` on the instance by the self-healing path, and stays there until a new
    instance is built from the configuration (spec/001: "a restart restores the configured
    value"). ``now`` (epoch seconds) drives the breaker; ``sleep`` the backoff; both are
    injectable for tests. ``outbound`` and ``secret_rule`` default to the process-wide policy
    and rule; an injected ``http_client`` (a test seam) bypasses the outbound guard.
    """

    def __init__(
        self,
        config: EndpointConfig,
        *,
        breaker: CircuitBreaker | None = None,
        stream_mode: StreamMode = "auto",
        auto_window_seconds: float = DEFAULT_AUTO_WINDOW_SECONDS,
        on_text: TextCallback | None = None,
        retry: RetryPolicy | None = None,
        http_client: httpx2.AsyncClient | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        environ: Mapping[str, str] | None = None,
        rng: random.Random | None = None,
        outbound: OutboundPolicy | None = None,
        secret_rule: SecretRule | None = None,
    ) -> None:
        self.config = config
        self.breaker = breaker
        self.stream_mode: StreamMode = stream_mode
        self.auto_window_seconds = auto_window_seconds
        self.on_text = on_text
        self.retry = retry or RetryPolicy()
        self._http_client = http_client
        self._sleep = sleep
        self._environ = os.environ if environ is None else environ
        self._rng = rng or random.Random()
        self.outbound = outbound or _current_policy()
        self.secret_rule = secret_rule or current_secret_rule()

    def __repr__(self) -> str:
        return f"<OpenAICompatibleClient endpoint={self.config.name!r} mode={self.stream_mode}>"

    async def complete(
        self, request: ChatRequest, *, on_text: TextCallback | None = None
    ) -> ChatResponse:
        """One model step. Raises :class:`ContextOverflow` or :class:`ModelCallFailed`."""
        sink = on_text or self.on_text
        try:
            return await self._complete_round(request, sink)
        except RoutedAsPlainText:
            logger.warning(
                "model endpoint %s: tool calls arrived after the text was routed as plain text; "
                "upgrading stream tool-call detection from %s to drain and re-running the round",
                self.config.name,
                self.stream_mode,
            )
            self.stream_mode = "drain"
            return await self._complete_round(request, sink)

    async def _complete_round(
        self, request: ChatRequest, sink: TextCallback | None
    ) -> ChatResponse:
        failures: list[EndpointError] = []
        async with self._http() as http:
            for target in self.config.chain():
                try:
                    return await self._try_endpoint(http, target, request, sink)
                except EndpointError as err:
                    err.endpoint = target.name
                    failures.append(err)
                    logger.warning("model endpoint %s failed: %s", target.name, err.detail)
                    if err.stop:
                        break
        raise _all_failed(failures)

    @asynccontextmanager
    async def _http(self) -> AsyncIterator[httpx2.AsyncClient]:
        if self._http_client is not None:
            yield self._http_client
            return
        pool = _pool()
        if pool is not None:
            async with pool.borrow(self.outbound) as client:
                yield client
            return
        # A client per call keeps connections tied to the caller's event loop and always
        # closed; the costly part (loading the trust store) is shared through the SSL context.
        async with outbound_http.async_client(self.outbound, verify=_ssl_context()) as client:
            yield client

    async def _try_endpoint(
        self,
        http: httpx2.AsyncClient,
        target: EndpointConfig,
        request: ChatRequest,
        sink: TextCallback | None,
    ) -> ChatResponse:
        admission = await self._admit(target)
        if not admission.allowed:
            raise EndpointError(
                "transient",
                f"circuit open, next probe in {admission.retry_in:.0f}s",
                # Denied during a probe, retry_in is the probe's whole lease; the probe itself
                # is over within one request timeout.
                retry_after=min(admission.retry_in, target.timeout_seconds + 1),
            )
        # A probe is exactly one request: retrying it would hammer an endpoint that is down.
        attempts = 1 if admission.verdict is Verdict.PROBE else target.max_retries + 1
        failed: list[int] = []  # attempts of this call that failed
        try:
            response = await self._call_with_retries(
                http, target, request, sink, attempts, admission, failed
            )
        except EndpointError as err:
            await self._settle(admission, target, available=not err.exhausted)
            if err.exhausted and self.breaker is not None and err.retry_after is None:
                err.retry_after = target.circuit_cooldown_seconds  # the circuit is open now
            raise
        except (ContextOverflow, RoutedAsPlainText):
            await self._settle(admission, target, available=True)  # it answered
            raise
        await self._settle(admission, target, available=True, failed_attempts=len(failed))
        return response

    async def _admit(self, target: EndpointConfig) -> CircuitAdmission:
        if self.breaker is None:
            return CircuitAdmission(target.breaker_key, Verdict.ALLOW)
        return await self.breaker.admit(target.breaker_key, probe_lease=target.probe_lease)

    async def _settle(
        self,
        admission: CircuitAdmission,
        target: EndpointConfig,
        *,
        available: bool,
        failed_attempts: int = 0,
    ) -> None:
        if self.breaker is None:
            return
        cooldown = target.circuit_cooldown_seconds
        if available:
            await self.breaker.record_success(
                admission, cooldown=cooldown, failed_attempts=failed_attempts
            )
            return
        await self.breaker.record_failure(admission, cooldown=cooldown)
        if admission.verdict is Verdict.ALLOW:
            logger.warning("model endpoint %s: retries exhausted, circuit tripped", target.name)

    async def _call_with_retries(
        self,
        http: httpx2.AsyncClient,
        target: EndpointConfig,
        request: ChatRequest,
        sink: TextCallback | None,
        attempts: int,
        admission: CircuitAdmission,
        failed: list[int],
    ) -> ChatResponse:
        try:
            key = api_key_from_env(target.api_key_env, self._environ, rule=self.secret_rule)
        except SecretNotAllowed as exc:
            raise EndpointError("endpoint", f"{exc} (refused before any request)") from None
        if target.api_key_env and key is None:
            raise EndpointError("endpoint", f"API key variable {target.api_key_env} is not set")
        body = build_body(request, target)
        for attempt in range(attempts):
            router = self._router(request, sink) if request.stream else None
            try:
                return await self._attempt(http, target, body, key, router)
            except EndpointError as err:
                if err.kind == "transient":
                    failed.append(attempt)
                    if await self._opened_by_failures(admission, target):
                        # The consecutive failures of every caller reached the threshold (or
                        # another caller opened the breaker): stop adding load
                        # (docs/reliability.md P5).
                        err.exhausted = True
                        err.detail = f"{err.detail}; circuit open"
                        raise err from None
                self._check_retry(err, router, last=attempt + 1 >= attempts)
                delay = self.retry.delay(attempt, err.retry_after, self._rng)
                logger.info(
                    "model endpoint %s: %s; retry %d of %d in %.2fs",
                    target.name,
                    err.detail,
                    attempt + 1,
                    attempts - 1,
                    delay,
                )
                await self._sleep(delay)
        raise AssertionError("unreachable: the last attempt either returns or raises")

    async def _opened_by_failures(
        self, admission: CircuitAdmission, target: EndpointConfig
    ) -> bool:
        """Count one failed attempt on the shared breaker; True when it is open now."""
        if self.breaker is None:
            return False
        cooldown = target.circuit_cooldown_seconds
        return await self.breaker.count_failure(admission, cooldown=cooldown)

    @staticmethod
    def _check_retry(err: EndpointError, router: StreamRouter | None, *, last: bool) -> None:
        """Re-raise ``err`` unless another attempt on this endpoint makes sense."""
        if err.kind != "transient":
            raise err
        if router is not None and router.emitted:
            # Text already went out live: a resend would repeat it to the user.
            err.detail = f"stream broke after output was delivered: {err.detail}"
            err.stop = True
            raise err
        if last:
            err.exhausted = True
            raise err

    def _router(self, request: ChatRequest, sink: TextCallback | None) -> StreamRouter:
        return StreamRouter(
            mode=self.stream_mode,
            tools_offered=bool(request.tools),
            on_text=sink,
            window=self.auto_window_seconds,
        )

    async def _attempt(
        self,
        http: httpx2.AsyncClient,
        target: EndpointConfig,
        body: dict[str, Any],
        key: Secret | None,
        router: StreamRouter | None,
    ) -> ChatResponse:
        url = target.base_url.rstrip("/") + "/chat/completions"
        try:
            # The URL's static rules (a row edited past the save-time checks); addresses are
            # checked on every new connection by the transports.
            outbound.check_url_cached(url, self.outbound)
        except outbound.OutboundRefused as exc:
            raise EndpointError("endpoint", redact(str(exc), key)) from None
        headers = {"Authorization": f"Bearer {key.reveal()}"} if key else {}
        connect = min(10.0, target.timeout_seconds)
        timeout = httpx2.Timeout(target.timeout_seconds, connect=connect)
        lite = _lite_pool() if router is None else None
        try:
            if lite is not None:
                async with asyncio.timeout(target.timeout_seconds):
                    answer = await lite.post_json(
                        url, body, headers, connect_timeout=connect, policy=self.outbound
                    )
                return _parse_response(answer, target, key)
            if router is None:
                # The whole answer within the timeout (httpx's timeouts are per read).
                async with asyncio.timeout(target.timeout_seconds):
                    response = await http.post(url, json=body, headers=headers, timeout=timeout)
                return _parse_response(response, target, key)
            return await _stream(http, url, body, headers, timeout, target, key, router)
        except http_lite.BadUrl as exc:
            raise EndpointError("endpoint", redact(f"bad base URL: {exc}", key)) from None
        except (outbound.OutboundRefused, outbound.ResponseTooLarge) as exc:
            # Configuration, not a passing fault: no retry here; another endpoint may do.
            raise EndpointError("endpoint", redact(str(exc), key)) from None
        except http_lite.HttpError as exc:
            raise EndpointError("transient", redact(str(exc), key)) from None
        except (httpx2.TimeoutException, TimeoutError):
            detail = f"timed out after {target.timeout_seconds:g}s"
            raise EndpointError("transient", detail) from None
        except (httpx2.UnsupportedProtocol, httpx2.InvalidURL) as exc:
            # A misconfigured base URL: retrying cannot help, another endpoint may.
            raise EndpointError("endpoint", redact(f"bad base URL: {exc}", key)) from None
        except httpx2.RequestError as exc:
            detail = redact(f"{type(exc).__name__}: {exc}", key)
            raise EndpointError("transient", detail) from None


def _current_policy() -> OutboundPolicy:
    return outbound.current_policy()


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    return httpx2.create_ssl_context()


# --- pooled HTTP clients for a long-lived event loop ---------------------------------------------


class _ClientPool:
    """Idle HTTP clients of one event loop, each with at most one keep-alive connection.

    A call borrows a client (the most recently returned, whose connection is the likeliest to
    be alive) and gives it back. One shared client with many connections would do the same,
    but httpx's pool checks every connection it holds on every request (a syscall or two
    each), which costs more than the request once a driver holds a hundred runs."""

    def __init__(self) -> None:
        self.idle: dict[OutboundPolicy, list[httpx2.AsyncClient]] = {}
        self.closed = False
        #: The plain JSON calls' keep-alive connections (``http_lite``).
        self.lite = http_lite.Pool(_ssl_context())

    @staticmethod
    def _new(policy: OutboundPolicy) -> httpx2.AsyncClient:
        limits = httpx2.Limits(max_connections=1, max_keepalive_connections=1)
        return outbound_http.async_client(policy, verify=_ssl_context(), limits=limits)

    @asynccontextmanager
    async def borrow(self, policy: OutboundPolicy) -> AsyncIterator[httpx2.AsyncClient]:
        """An idle client whose connection ``policy`` checked, or a new one."""
        idle = self.idle.get(policy)
        client = idle.pop() if idle else self._new(policy)
        try:
            yield client
        finally:
            idle = self.idle.setdefault(policy, [])
            if self.closed or len(idle) >= POOL_IDLE_CLIENTS:
                await client.aclose()
            else:
                idle.append(client)

    async def close(self) -> None:
        self.closed = True
        idle, self.idle = self.idle, {}
        for clients in idle.values():
            for client in clients:
                await client.aclose()
        if self.lite is not None:
            await self.lite.close()


#: Event loops that pool their model connections (the run driver's).
_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _ClientPool] = (
    weakref.WeakKeyDictionary()
)
#: Idle clients (keep-alive connections) kept per loop.
POOL_IDLE_CLIENTS = 256


def pool_http_connections(loop: asyncio.AbstractEventLoop) -> None:
    """Let model calls made on ``loop`` reuse HTTP clients and their keep-alive connections
    (:class:`_ClientPool`) instead of making a client and a connection per call.

    For a long-lived loop that closes the pool itself (:func:`close_http_pool`): the run
    driver's. Setting up a client and a TCP connection per model call costs milliseconds of
    CPU, a large part of a step's overhead, and it is what limits throughput."""
    _POOLS.setdefault(loop, _ClientPool())


def _pool() -> _ClientPool | None:
    try:
        return _POOLS.get(asyncio.get_running_loop())
    except RuntimeError:
        return None


def _lite_pool() -> http_lite.Pool | None:
    pool = _pool()
    return None if pool is None else pool.lite


async def close_http_pool() -> None:
    """Close the running loop's idle pooled clients and stop pooling on this loop."""
    pool = _POOLS.pop(asyncio.get_running_loop(), None)
    if pool is not None:
        await pool.close()


def _parse_response(
    response: httpx2.Response | http_lite.Response, target: EndpointConfig, key: Secret | None
) -> ChatResponse:
    if response.status_code >= 300:
        raise _error_from_response(
            response.status_code, redact(response.text, key), response.headers
        )
    try:
        data = response.json()
    except ValueError:
        raise EndpointError("transient", "malformed completion: body is not JSON") from None
    if isinstance(data, dict) and data.get("error"):
        raise _error_from_payload(data["error"], key)
    return parse_completion(data, target)


async def _stream(
    http: httpx2.AsyncClient,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    timeout: httpx2.Timeout,
    target: EndpointConfig,
    key: Secret | None,
    router: StreamRouter,
) -> ChatResponse:
    async with http.sse(url, method="POST", json=body, headers=headers, timeout=timeout) as source:
        response = source.response
        if response.status_code >= 300 or _is_json(response):
            # Errors come as plain JSON; so do answers of servers that ignore "stream".
            await response.aread()
            parsed = _parse_response(response, target, key)
            await _replay(parsed, router)
            return parsed
        accumulator = StreamAccumulator()
        await route_stream(_chunks(source, key), accumulator, router)
    return accumulator.response(endpoint=target.name, cost=target.cost)


def _is_json(response: httpx2.Response) -> bool:
    return response.headers.get("content-type", "").startswith("application/json")


async def _replay(parsed: ChatResponse, router: StreamRouter) -> None:
    if parsed.tool_calls:
        await router.tool_call()
    await router.text(parsed.content, time.monotonic())
    await router.end()


async def _chunks(source: httpx2.EventSource, key: Secret | None) -> AsyncIterator[dict[str, Any]]:
    finished = False
    async for event in source:
        data = event.data.strip()
        if data == "[DONE]":
            return
        if not data:
            continue
        try:
            chunk = json.loads(data)
        except ValueError:
            raise EndpointError("transient", "malformed stream chunk: not JSON") from None
        if isinstance(chunk, dict) and chunk.get("error"):
            raise _error_from_payload(chunk["error"], key)
        if isinstance(chunk, dict):
            finished = finished or any(c.get("finish_reason") for c in chunk.get("choices") or [])
            yield chunk
    if not finished:
        # The connection closed mid-answer: a truncated answer must not pass as a complete one.
        raise EndpointError("transient", "stream ended before the answer was finished")


def _all_failed(failures: list[EndpointError]) -> ModelCallFailed:
    retryable = any(f.kind == "transient" for f in failures)
    summary = "; ".join(f"{f.endpoint}: {f.detail}" for f in failures) or "no endpoint"
    hints = [f.retry_after for f in failures if f.retry_after is not None]
    return ModelCallFailed(
        f"model call failed ({summary})",
        retryable=retryable,
        retry_after=min(hints) if retryable and hints else None,
    )


def client_for_endpoint(
    config: EndpointConfig,
    *,
    breaker: CircuitBreaker | None = None,
    stream_mode: StreamMode = "auto",
    on_text: TextCallback | None = None,
    **options: Any,
) -> ModelClient:
    """The client for ``config.provider``: the HTTP client, or the offline scripted model."""
    if config.provider == "scripted":
        from runtime.scripted import ScriptedModelClient, load_script

        return ScriptedModelClient(
            load_script(config.script), endpoint=config.name, on_text=on_text
        )
    return OpenAICompatibleClient(
        config, breaker=breaker, stream_mode=stream_mode, on_text=on_text, **options
    )

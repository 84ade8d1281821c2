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
import contextlib
import contextvars
import json
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import httpx2

from runtime import http_lite, model_pool, outbound, outbound_http
from runtime.breaker import CircuitAdmission, CircuitBreaker, Verdict
from runtime.model_config import (
    EndpointConfig,
    EndpointFailure,
    EndpointOverflow,
    EndpointsFailed,
    RetryPolicy,
)
from runtime.model_wire import (
    EndpointError,
    apply_keep_think,
    build_body,
    error_from_payload,
    parse_response,
)
from runtime.observers import runtime_observer
from runtime.outbound import OutboundPolicy
from runtime.scripted import ScriptedModelClient, load_script
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
)
from runtime.types import ChatRequest, ChatResponse, ContextOverflow, ModelClient

logger = logging.getLogger(__name__)

#: How long the rest of a streamed body after ``[DONE]`` is read for (see ``_drain``).
DRAIN_SECONDS = 1.0

StreamRetryMode = Literal["off", "full"]

#: Called (when set in the caller's context) each time an endpoint accepted a streamed call: it
#: answered 2xx with an event stream. The OpenAI-compatible endpoint starts its own response then.
STREAM_ACCEPTED: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "stream_accepted", default=None
)

# httpcore's DEBUG trace prints response headers verbatim, and providers and proxies do echo
# credentials back in headers; a DEBUG log level must not turn that into a leaked key. Pin the
# transport trace to INFO unless an operator configured that logger explicitly.
_transport_logger = logging.getLogger("httpcore2")
if _transport_logger.level == logging.NOTSET:
    _transport_logger.setLevel(logging.INFO)


class OpenAICompatibleClient:
    """:class:`ModelClient` for any OpenAI-compatible Chat Completions endpoint.

    One instance serves one employee (or one request): the streaming detection mode can be
    upgraded to ``drain`` on the instance by the self-healing path, and stays there until a new
    instance is built from the configuration (a restart restores the configured value).
    ``now`` (epoch seconds) drives the breaker; ``sleep`` the backoff; both are injectable for
    tests. ``outbound`` and ``secret_rule`` default to the process-wide policy
    and rule; an injected ``http_client`` (a test seam) bypasses the outbound guard.
    """

    def __init__(
        self,
        config: EndpointConfig,
        *,
        breaker: CircuitBreaker | None = None,
        stream_mode: StreamMode = "auto",
        stream_retry_mode: StreamRetryMode = "off",
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
        #: ``full``: a streamed call is read whole before any of it is released, so a stream
        #: that breaks midway is retried (and fails over) like a non-streamed call.
        self.stream_retry_mode: StreamRetryMode = stream_retry_mode
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
        self,
        request: ChatRequest,
        *,
        on_text: TextCallback | None = None,
        on_reasoning: TextCallback | None = None,
    ) -> ChatResponse:
        """One model step. Raises :class:`ContextOverflow` or :class:`ModelCallFailed`.
        A streamed step hands released text to ``on_text`` and reasoning to ``on_reasoning``."""
        sink = _Sinks(on_text or self.on_text, on_reasoning)
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

    async def _complete_round(self, request: ChatRequest, sink: _Sinks) -> ChatResponse:
        failures: list[EndpointError] = []
        async with self._http() as http:
            for target in self.config.chain():
                started = time.monotonic()
                try:
                    response = await self._try_endpoint(http, target, request, sink)
                except EndpointError as err:
                    _observed(target, started, "circuit_open" if _refused(err) else err.kind)
                    err.endpoint = target.name
                    failures.append(err)
                    logger.warning("model endpoint %s failed: %s", target.name, err.detail)
                    if err.stop:
                        break
                else:
                    _observed(target, started, "")
                    text_format = request.response_format == "text" and (
                        target.params.response_format == "text"
                    )
                    return apply_keep_think(
                        response, keep=target.params.keep_think, text_format=text_format
                    )
        raise _all_failed(failures)

    @asynccontextmanager
    async def _http(self) -> AsyncIterator[httpx2.AsyncClient]:
        if self._http_client is not None:
            yield self._http_client
            return
        pool = model_pool.loop_pool()
        if pool is not None:
            async with pool.borrow(self.outbound) as client:
                yield client
            return
        # A client per call keeps connections tied to the caller's event loop and always
        # closed; the costly part (loading the trust store) is shared through the SSL context.
        verify = model_pool.ssl_context()
        async with outbound_http.async_client(self.outbound, verify=verify) as client:
            yield client

    async def _try_endpoint(
        self,
        http: httpx2.AsyncClient,
        target: EndpointConfig,
        request: ChatRequest,
        sink: _Sinks,
    ) -> ChatResponse:
        admission = await self._admit(target)
        if not admission.allowed:
            raise _refusal(admission, target)
        # A probe is exactly one request: retrying it would hammer an endpoint that is down.
        attempts = 1 if admission.verdict is Verdict.PROBE else target.max_retries + 1
        failed: list[int] = []  # attempts of this call that failed
        try:
            response = await self._call_with_retries(
                http, target, request, sink, attempts, admission, failed
            )
        except EndpointError as err:
            await self._settle(admission, target, available=not err.exhausted)
            if err.exhausted and self.breaker is not None:
                # The circuit is open now: nobody may call before its next probe (a failed
                # probe doubled the cooldown), whatever a Retry-After said.
                after = await self.breaker.next_probe_in(target.breaker_key)
                if after is not None:
                    err.retry_after = after
                elif err.retry_after is None:
                    err.retry_after = target.circuit_cooldown_seconds
            raise
        except ContextOverflow as exc:
            await self._settle(admission, target, available=True)  # it answered
            raise EndpointOverflow(
                str(exc), endpoint=target.name, context_window=target.context_window
            ) from exc
        except RoutedAsPlainText:
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
        sink: _Sinks,
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
        buffered = request.stream and self.stream_retry_mode == "full"
        for attempt in range(attempts):
            router = self._router(request, sink, buffered) if request.stream else None
            try:
                response = await self._attempt(http, target, body, key, router)
            except EndpointError as err:
                runtime_observer().model_error(endpoint=target.name, kind=err.kind)
                if err.kind == "transient":
                    failed.append(attempt)
                    if await self._opened_by_failures(admission, target):
                        # The consecutive failures of every caller reached the threshold (or
                        # another caller opened the breaker): stop adding load
                        # (docs/reliability.md P5).
                        err.exhausted = True
                        err.detail = f"{err.detail}; circuit open"
                        raise err from None
                self._check_retry(err, None if buffered else router, last=attempt + 1 >= attempts)
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
                continue
            if buffered:  # whole now: released as a JSON answer to a streamed request is
                await _replay(response, self._router(request, sink))
            return response
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

    def _router(self, request: ChatRequest, sink: _Sinks, buffered: bool = False) -> StreamRouter:
        """The live router of a streamed attempt; ``buffered`` (streamRetryMode full): one
        that releases nothing (the whole answer is replayed to a live one when it is in)."""
        if buffered:
            return StreamRouter(mode="drain", tools_offered=bool(request.tools), on_text=None)
        return StreamRouter(
            mode=self.stream_mode,
            tools_offered=bool(request.tools),
            on_text=sink.text,
            window=self.auto_window_seconds,
            on_reasoning=sink.reasoning,
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
        lite = model_pool.lite_pool() if router is None else None
        try:
            if lite is not None:
                async with asyncio.timeout(target.timeout_seconds):
                    answer = await lite.post_json(
                        url, body, headers, connect_timeout=connect, policy=self.outbound
                    )
                return parse_response(answer, target, key)
            if router is None:
                # The whole answer within the timeout (httpx's timeouts are per read).
                async with asyncio.timeout(target.timeout_seconds):
                    response = await http.post(url, json=body, headers=headers, timeout=timeout)
                return parse_response(response, target, key)
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


@dataclass(frozen=True)
class _Sinks:
    """Where one call's streamed text and reasoning go."""

    text: TextCallback | None
    reasoning: TextCallback | None = None


def _current_policy() -> OutboundPolicy:
    return outbound.current_policy()


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
            parsed = parse_response(response, target, key)
            await _replay(parsed, router)
            return parsed
        accepted = STREAM_ACCEPTED.get()
        if accepted is not None:
            accepted()
        accumulator = StreamAccumulator()
        await route_stream(_chunks(source, key), accumulator, router)
    return accumulator.response(endpoint=target.name, cost=target.cost, model=target.model)


async def _drain(events: AsyncIterator[httpx2.ServerSentEvent]) -> None:
    """Read what follows ``[DONE]`` (the body's end) so the connection goes back to the pool;
    a response closed before its end is dropped, and the next call connects again. Bounded: a
    server that keeps sending after ``[DONE]`` loses its connection instead."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(DRAIN_SECONDS):
            async for _ in events:
                pass


def _is_json(response: httpx2.Response) -> bool:
    return response.headers.get("content-type", "").startswith("application/json")


async def _replay(parsed: ChatResponse, router: StreamRouter) -> None:
    await router.reasoning(parsed.reasoning_content)
    if parsed.tool_calls:
        await router.tool_call()
    await router.text(parsed.content, time.monotonic())
    await router.end()


async def _chunks(source: httpx2.EventSource, key: Secret | None) -> AsyncIterator[dict[str, Any]]:
    finished = False
    events = aiter(source)
    async for event in events:
        data = event.data.strip()
        if data == "[DONE]":
            await _drain(events)
            return
        if not data:
            continue
        try:
            chunk = json.loads(data)
        except ValueError:
            raise EndpointError("transient", "malformed stream chunk: not JSON") from None
        if isinstance(chunk, dict) and chunk.get("error"):
            raise error_from_payload(chunk["error"], key)
        if isinstance(chunk, dict):
            finished = finished or any(c.get("finish_reason") for c in chunk.get("choices") or [])
            yield chunk
    if not finished:
        # The connection closed mid-answer: a truncated answer must not pass as a complete one.
        raise EndpointError("transient", "stream ended before the answer was finished")


class CircuitRefused(EndpointError):
    """The endpoint's open circuit refused the call: no request was sent."""


def _refused(err: EndpointError) -> bool:
    return isinstance(err, CircuitRefused)


def _observed(target: EndpointConfig, started: float, error: str) -> None:
    seconds = time.monotonic() - started
    runtime_observer().model_call(endpoint=target.name, seconds=seconds, error=error)


def _refusal(admission: CircuitAdmission, target: EndpointConfig) -> CircuitRefused:
    """The failure of an endpoint whose breaker refused the call, with when to try again: the
    next probe of an open breaker, or, while a probe is in flight, the end of that probe (one
    request timeout; its lease is only how long a vanished holder keeps it)."""
    if admission.probing:
        after = min(admission.retry_in, target.timeout_seconds + 1)
        detail = f"circuit half-open, a probe is in flight (its answer within {after:.0f}s)"
    else:
        after = admission.retry_in
        detail = f"circuit open, next probe in {after:.0f}s"
    return CircuitRefused("transient", detail, retry_after=after)


def _all_failed(failures: list[EndpointError]) -> EndpointsFailed:
    retryable = any(f.kind == "transient" for f in failures)
    summary = "; ".join(f"{f.endpoint}: {f.detail}" for f in failures) or "no endpoint"
    hints = [f.retry_after for f in failures if f.retry_after is not None]
    return EndpointsFailed(
        f"model call failed ({summary})",
        retryable=retryable,
        retry_after=min(hints) if retryable and hints else None,
        failures=tuple(
            EndpointFailure(
                f.endpoint,
                f.detail,
                f.kind == "transient",
                isinstance(f, CircuitRefused),
                rate_limited=f.status == 429,
            )
            for f in failures
        ),
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
        return ScriptedModelClient(
            load_script(config.script), endpoint=config.name, on_text=on_text
        )
    return OpenAICompatibleClient(
        config, breaker=breaker, stream_mode=stream_mode, on_text=on_text, **options
    )

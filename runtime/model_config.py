"""What a model call needs to know about an endpoint, with no database behind it: its
parameters (:class:`ModelParams`, the camelCase ``params`` of the API), the endpoint and its
failover chain (:class:`EndpointConfig`), the backoff between attempts (:class:`RetryPolicy`),
and what a failed call says about its endpoints (:class:`EndpointsFailed`,
:class:`EndpointOverflow`).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from runtime.types import ContextOverflow, ModelCallFailed, Usage

Provider = Literal["openai", "scripted"]
RESERVED_BODY_KEYS = frozenset(
    {"model", "messages", "tools", "tool_choice", "stream", "stream_options"}
)


class ModelParams(BaseModel):
    """LLM parameters (docs/model-client.md; camelCase on the API; unset means the provider's
    default)."""

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
    #: Keep the model's reasoning in the answer text (``<think>…</think>`` before it); false:
    #: a leading ``<think>`` block is moved out of the text. Never sent to the endpoint.
    keep_think: bool = Field(default=False, alias="keepThink")
    #: Merged into the request body last (provider-specific knobs such as reasoning_effort).
    extra_fields: dict[str, Any] = Field(default_factory=dict, alias="extraFields")

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("json_schema", mode="before")
    @classmethod
    def _schema_from_text(cls, value: Any) -> Any:
        # The API carries jsonSchema as a string; accept that and objects alike.
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


@dataclass(frozen=True)
class EndpointFailure:
    """How one endpoint of a call's chain failed (its text already redacted)."""

    endpoint: str
    detail: str
    transient: bool
    #: Refused by the endpoint's open circuit, without a request (``detail`` says when the
    #: next probe is), so it says nothing new about the endpoint's own error.
    circuit: bool = False
    #: The endpoint answered 429 (rate limited).
    rate_limited: bool = False


class EndpointsFailed(ModelCallFailed):
    """:class:`ModelCallFailed` of the HTTP client, with each endpoint's failure in chain
    order."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        retry_after: float | None = None,
        failures: tuple[EndpointFailure, ...] = (),
    ) -> None:
        super().__init__(message, retryable=retryable, retry_after=retry_after)
        self.failures = failures

    def last_error(self) -> EndpointFailure | None:
        """The failure that says most about why no endpoint answered: the last one that came
        from an endpoint's own answer (or its silence), else the last circuit refusal."""
        answered = [f for f in self.failures if not f.circuit]
        chosen = answered or list(self.failures)
        return chosen[-1] if chosen else None


class EndpointOverflow(ContextOverflow):
    """:class:`ContextOverflow` from a named endpoint, with the context window configured for
    it: what the loop weighs the provider's claim against."""

    def __init__(self, message: str, *, endpoint: str, context_window: int) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.context_window = context_window

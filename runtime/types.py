"""Types shared by the model client, the tool loop and the tools (OpenAI Chat Completions shape).

Messages are kept in the wire shape of the Chat Completions API so they can be persisted as
steps and replayed into a request without translation.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Message = dict[str, Any]
"""One chat message in wire shape: {"role": ..., "content": ..., "tool_calls"?: ..., ...}."""


class Effect(enum.StrEnum):
    """What a tool does to the world; maps to the trust tiers read / write / high-risk."""

    READ = "read"
    WRITE = "write"
    EXTERNAL = "external"


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    #: The raw JSON text the model produced (may be malformed; the loop validates it).
    arguments: str


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class ChatResponse:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning_content: str = ""
    usage: Usage = field(default_factory=Usage)
    finish_reason: str = ""
    model: str = ""
    #: Which endpoint answered (the primary or a failover), for cost accounting and traces.
    endpoint: str = ""
    #: Cost of this call from the answering endpoint's per-token prices (0 when unpriced).
    cost: float = 0.0


ResponseFormat = Literal["text", "json_object", "json_schema"]


@dataclass(frozen=True)
class ChatRequest:
    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)
    #: None leaves the provider's default; "none" forbids tool use in this step; also the
    #: OpenAI object form ``{"type": "function", "function": {"name": ...}}``.
    tool_choice: str | dict[str, Any] | None = None
    response_format: ResponseFormat = "text"
    json_schema: dict[str, Any] | None = None
    stream: bool = False
    max_tokens: int | None = None
    #: This request's sampling temperature (over the endpoint's ``params``); None: theirs.
    temperature: float | None = None


class ContextOverflow(Exception):
    """The provider said the request does not fit the model's context window."""


class ModelCallFailed(Exception):
    """Every endpoint failed (after retries and failover); ``retryable`` tells whether to retry."""

    def __init__(self, message: str, *, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        #: Seconds until an endpoint may answer again (an open circuit's next probe, a
        #: Retry-After), when one said so: how long a parked run should wait.
        self.retry_after = retry_after


class ModelClient(Protocol):
    async def complete(self, request: ChatRequest) -> ChatResponse:
        """One model step. Raises ContextOverflow or ModelCallFailed."""
        ...


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the registry declares it (before policy)."""

    name: str
    description: str
    parameters: dict[str, Any]
    effect: Effect
    #: False when Loopwright cannot enforce policy on it (it is then blocked at the source).
    enforceable: bool = True
    #: It works in the invocation's working directory (not offered where there is none).
    needs_workdir: bool = False
    #: The schema of the form a person edits a gated call's arguments with (a skill's
    #: interactionSchema, else its input schema); None: the arguments as JSON. Never sent to
    #: a model; an approval captures it when it opens.
    interaction_schema: dict[str, Any] | None = None
    #: The JSON Schema of the review a person must fill to decide a gated call (a reviewed
    #: skill's review schema); None: no review is asked, and none is accepted.
    review_schema: dict[str, Any] | None = None

"""The semantic cache in runs (docs/semantic-cache.md): a read-only role's model calls answered
from the pattern's earlier answers to near-identical calls.

:func:`semantic_cache_wrap` wraps an invocation's model client and journal when the run's policy
snapshot enables ``semanticCache`` and every tool the role is offered is a read. A call is
looked up only when each tool it offers is one of those reads; a hit is returned without a
model request and its model step is recorded with ``"cached": true`` and the entry's id; a miss
goes to the model and, once its step is recorded, the answer is stored. An embedding failure is
logged and the call goes to the model: the cache never fails a run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError

from loops.services.semantic_cache import (
    CacheHit,
    CacheTarget,
    semantic_cache_lookup,
    semantic_cache_store,
    semantic_cache_target,
)
from orchestrator.metrics import SEMANTIC_CACHE_LOOKUPS
from runtime.embeddings import EmbeddingFailed, embed
from runtime.invocation import InvocationRequest, StepJournal
from runtime.model_config import EndpointConfig
from runtime.policy import ToolPolicy
from runtime.tools import ToolRegistry
from runtime.types import ChatRequest, ChatResponse, Effect, Message, ModelClient, ToolCall

logger = logging.getLogger(__name__)

#: The key of ``InvocationRequest.context`` holding the run's ``semanticCache`` policy.
CONTEXT_KEY = "semantic_cache"
#: Characters of the conversation embedded (its head and tail when longer), then of the prompt.
MAX_CHARS = 16_000
PROMPT_CHARS = 2_000
#: Answers cut short or filtered are not stored.
_INCOMPLETE = frozenset({"length", "content_filter"})


def semantic_cache_wrap(
    request: InvocationRequest,
    client: ModelClient,
    journal: StepJournal,
    policy: ToolPolicy,
    tools: ToolRegistry,
) -> tuple[ModelClient, StepJournal]:
    """``client`` and ``journal`` as they are unless the cache is on and every tool ``policy``
    offers is a read (``tools`` knows it); a role that may change anything is never cached."""
    config = request.context.get(CONTEXT_KEY) or {}
    if not config.get("enabled") or request.client_tools:
        return client, journal
    offered = [name for name in policy.rules if policy.offers(name)]
    if not all(_effect(tools, name) == Effect.READ for name in offered):
        return client, journal
    cache = _Cache(request, config, journal, frozenset(offered), _endpoint(client))
    return _CachingClient(client, cache), _CacheJournal(journal, cache)


def _effect(tools: ToolRegistry, name: str) -> Effect | None:
    tool = tools.get(name)
    return None if tool is None else tool.spec.effect


def embedding_text(messages: Sequence[Message]) -> str:
    """What is embedded: the conversation (head and tail when long), then the system prompt."""
    talk = "\n".join(_line(m) for m in messages if m.get("role") != "system")
    if len(talk) > MAX_CHARS:
        talk = talk[: MAX_CHARS // 2] + "\n...\n" + talk[-MAX_CHARS // 2 :]
    prompt = "\n".join(_line(m) for m in messages if m.get("role") == "system")
    return f"{talk}\n{prompt[:PROMPT_CHARS]}"


def _line(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    calls = [
        f"{(c.get('function') or {}).get('name')}({(c.get('function') or {}).get('arguments')})"
        for c in message.get("tool_calls") or []
        if isinstance(c, dict)
    ]
    return f"{message.get('role')}: {content or ''} {' '.join(calls)}".rstrip()


def exact_key(employee: str, endpoint: str, tools: Sequence[str], request: ChatRequest) -> str:
    """The hash of what a hit must share exactly with the call."""
    parts = {
        "employee": employee,
        "endpoint": endpoint,
        "tools": sorted(tools),
        "response_format": request.response_format,
        "json_schema": request.json_schema,
        "tool_choice": request.tool_choice,
        # A conversation of another length is another step of the loop.
        "messages": len(request.messages),
    }
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _endpoint(client: Any) -> str:
    """``name/model`` of the endpoint a (wrapped) client calls."""
    for _ in range(8):
        config = getattr(client, "config", None)
        if isinstance(config, EndpointConfig):
            return f"{config.name}/{config.model}"
        client = getattr(client, "inner", None)
        if client is None:
            break
    return "unknown"


def response_of(record: dict[str, Any]) -> ChatResponse:
    """A stored step response (the journal's shape) as the model's answer, at no cost."""
    message = record.get("message") or {}
    calls = [
        ToolCall(
            id=str(call.get("id", "")),
            name=str((call.get("function") or {}).get("name", "")),
            arguments=str((call.get("function") or {}).get("arguments", "")),
        )
        for call in message.get("tool_calls") or []
    ]
    return ChatResponse(
        content=str(message.get("content") or ""),
        tool_calls=calls,
        reasoning_content=str(record.get("reasoning_content") or ""),
        finish_reason=str(record.get("finish_reason") or ""),
        model=str(record.get("model") or ""),
        endpoint=str(record.get("endpoint") or ""),
    )


@dataclass
class _Cache:
    """One invocation's cache: its settings, and what the last call left for its step."""

    request: InvocationRequest
    config: dict[str, Any]
    journal: StepJournal
    read_tools: frozenset[str]
    endpoint: str
    target: CacheTarget | None = None
    loaded: bool = False
    #: The hit the next recorded model step answers with.
    hit: CacheHit | None = None
    #: The (key, vector) under which the next recorded model step is stored.
    store: tuple[str, list[float]] | None = None

    async def _target(self) -> CacheTarget | None:
        if not self.loaded:
            self.loaded = True
            endpoint = str(self.config.get("embeddingEndpoint") or "")
            self.target = await self.journal.db_call(
                semantic_cache_target, run_id=self.request.run_id, endpoint=endpoint
            )
            if self.target is None:
                logger.warning("semantic cache of run %s: no endpoint", self.request.run_id)
        return self.target

    async def lookup(self, call: ChatRequest, tools: list[str]) -> tuple[str, list[float]] | None:
        """The call's key and vector (a hit is left in ``hit``); None when it cannot embed."""
        target = await self._target()
        if target is None:
            return None
        key = exact_key(self.request.employee_username, self.endpoint, tools, call)
        model, text = str(self.config.get("embeddingModel") or ""), embedding_text(call.messages)
        try:
            [vector] = await asyncio.to_thread(
                embed, target.base_url, model, [text], key_env=target.api_key_env
            )
        except EmbeddingFailed as exc:
            SEMANTIC_CACHE_LOOKUPS.labels(outcome="error").inc()
            logger.warning("semantic cache of run %s: %s", self.request.run_id, exc)
            return None
        self.hit = await self.journal.db_call(
            semantic_cache_lookup,
            pattern_id=target.pattern_id,
            key=key,
            vector=vector,
            threshold=float(self.config.get("threshold", 0.95)),
        )
        SEMANTIC_CACHE_LOOKUPS.labels(outcome="miss" if self.hit is None else "hit").inc()
        return key, vector

    async def keep(self, stored: tuple[str, list[float]], response: dict[str, Any]) -> None:
        """Store a recorded answer; a failing store is logged (the run goes on)."""
        if self.target is None:
            return
        try:
            await self.journal.db_call(
                semantic_cache_store,
                pattern_id=self.target.pattern_id,
                key=stored[0],
                vector=stored[1],
                response=response,
                ttl_seconds=int(self.config.get("ttlSeconds", 3600)),
            )
        except DatabaseError:
            logger.warning(
                "semantic cache of run %s: not stored", self.request.run_id, exc_info=True
            )


class _CachingClient:
    """The invocation's client, answering read-only calls from the cache when it can."""

    def __init__(self, inner: ModelClient, cache: _Cache) -> None:
        self.inner, self.cache = inner, cache

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.cache.hit, self.cache.store = None, None
        tools = [str((t.get("function") or {}).get("name", "")) for t in request.tools]
        if not all(name in self.cache.read_tools for name in tools):
            return await self.inner.complete(request)
        found = await self.cache.lookup(request, tools)
        if found is None:
            return await self.inner.complete(request)
        if self.cache.hit is not None:
            return response_of(self.cache.hit.response)
        response = await self.inner.complete(request)
        if response.finish_reason not in _INCOMPLETE and (response.content or response.tool_calls):
            self.cache.store = found
        return response


class _CacheJournal:
    """The invocation's journal: a model step answered from the cache says so; an answered
    one is stored once it is recorded."""

    def __init__(self, inner: StepJournal, cache: _Cache) -> None:
        self.inner, self.cache = inner, cache

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def record(self, *, kind: str, response: Any, **fields: Any) -> int:
        hit, stored = (self.cache.hit, self.cache.store) if kind == "model" else (None, None)
        if kind == "model":
            self.cache.hit, self.cache.store = None, None
        if hit is not None and isinstance(response, dict):
            similarity = round(hit.similarity, 4)
            response = {**response, "cached": True, "cache_entry": hit.entry_id}
            response["cache_similarity"] = similarity
        seq: int = await self.inner.record(kind=kind, response=response, **fields)
        if stored is not None and isinstance(response, dict):
            await self.cache.keep(stored, response)
        return seq

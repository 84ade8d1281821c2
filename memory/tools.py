"""Agent memory as agent tools: ``memory_search``, ``memory_save``, ``memory_delete``
(docs/memory.md).

:class:`MemoryToolProvider` is a :class:`~runtime.tools.registry.ToolProvider` registered by the
app; its tools have fixed names, so the harness tool plan decides them like any other (the
search is a read, saving and deleting are writes) and they are offered only to an employee that
binds them. Each call authorises from the invocation its context carries (``Invocation``: run,
employee, the person the work is for, the role's compiled harness): the harness ``memory``
section must allow it (``enabled`` for the search, ``write`` to save or delete, the scope in
``scopes``), and a ``user`` or ``agent_user`` scope needs a person. A refusal is a tool error
naming the setting. ``memory_save`` saves once per call (``ToolContext.call_key``), so a call
re-issued after a crash finds what it saved.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from memory.models import MAX_CONTENT_CHARS, MAX_TAG_CHARS, MAX_TAGS, MemoryItem, MemoryItemScope
from memory.policy import MemoryPolicy
from memory.services import (
    UseOrigin,
    agent_actor,
    memory_delete,
    memory_save_once,
    memory_search,
    memory_uses_record,
    memory_visible,
)
from orchestrator.dbthreads import OffLoopDb
from orchestrator.errors import InvalidInput
from runtime.tools.base import Invocation, Tool, ToolContext, ToolError, ToolResult
from runtime.types import Effect, ToolSpec

SEARCH, SAVE, DELETE = "memory_search", "memory_save", "memory_delete"
#: The invocation name of a request-scoped chat (``runtime.chat``): its ``run_id`` is no run.
CHAT_INVOCATION = "chat"
MAX_QUERY_CHARS = 2000
SCOPES = [s.value for s in MemoryItemScope]
_THREADS = OffLoopDb("memory-tools")
T = TypeVar("T")

_SCOPE_ARG = {
    "type": "string",
    "enum": SCOPES,
    "description": "public: for everyone; user: about the person you work for, shared by "
    "every employee; agent_user: your own memory of that person.",
}
SPECS: dict[str, ToolSpec] = {
    SEARCH: ToolSpec(
        name=SEARCH,
        description="Search agent memory (facts saved earlier about the person you work for, "
        "and public ones) by words; the best matches first, each with its id and scope.",
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_CHARS},
                "scope": {**_SCOPE_ARG, "description": "Search only this scope."},
                "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        effect=Effect.READ,
    ),
    SAVE: ToolSpec(
        name=SAVE,
        description="Save a fact to agent memory so later runs and chats are given it. Keep "
        "it short and self-contained; default scope agent_user (your memory of this person).",
        parameters={
            "type": "object",
            "properties": {
                "content": {"type": "string", "minLength": 1, "maxLength": MAX_CONTENT_CHARS},
                "scope": {**_SCOPE_ARG, "default": MemoryItemScope.AGENT_USER.value},
                "tags": {
                    "type": "array",
                    "items": {"type": "string", "minLength": 1, "maxLength": MAX_TAG_CHARS},
                    "maxItems": MAX_TAGS,
                    "uniqueItems": True,
                },
            },
            "required": ["content"],
            "additionalProperties": False,
        },
        effect=Effect.WRITE,
    ),
    DELETE: ToolSpec(
        name=DELETE,
        description="Delete an agent memory item you can see, by its id (from memory_search or "
        "the memory block of your prompt).",
        parameters={
            "type": "object",
            "properties": {"id": {"type": "string", "format": "uuid", "maxLength": 36}},
            "required": ["id"],
            "additionalProperties": False,
        },
        effect=Effect.WRITE,
    ),
}


class MemoryToolProvider:
    """The memory tools of the production registry (always the same three)."""

    def get(self, name: str) -> Tool | None:
        spec = SPECS.get(name)
        return None if spec is None else MemoryTool(spec)

    def specs(self) -> list[ToolSpec]:
        return list(SPECS.values())

    def review_gates(self, names: Iterable[str]) -> dict[str, tuple[str, str]]:
        return {}  # the harness plan decides


MEMORY_TOOLS = MemoryToolProvider()


# --- authorisation -------------------------------------------------------------------------


def _setting(invocation: Invocation, path: str) -> str:
    """``memory.write`` with the layer that decided it, when the snapshot says."""
    layer = (invocation.harness_provenance or {}).get(path)
    return f"{path} (set by {layer})" if layer else path


def _caller(context: ToolContext, tool: str) -> tuple[Invocation, MemoryPolicy]:
    invocation = context.invocation
    if invocation is None:
        raise ToolError(f"{tool} runs only inside a run or a chat, for an AI employee.")
    return invocation, MemoryPolicy.of(invocation.harness)


def _scope_allowed(invocation: Invocation, policy: MemoryPolicy, scope: str) -> None:
    if scope not in SCOPES:
        raise ToolError(f"Unknown scope {scope!r}: use one of {', '.join(SCOPES)}.")
    if scope not in policy.scopes:
        allowed = ", ".join(sorted(policy.scopes)) or "none"
        raise ToolError(
            f"The scope {scope} is not allowed: the role's harness "
            f"{_setting(invocation, 'memory.scopes')} allows {allowed}."
        )
    if scope != MemoryItemScope.PUBLIC and not invocation.user:
        raise ToolError(
            f"The scope {scope} is about the person the work is for, and this work is for "
            "nobody known (no user); use the public scope or do without memory."
        )


def origin_of(invocation: Invocation) -> UseOrigin:
    chat = invocation.name == CHAT_INVOCATION
    return UseOrigin(
        actor=agent_actor(invocation.employee),
        run_id=None if chat else invocation.run_id,
        invocation=invocation.name,
        chat=chat,
    )


def item_line(item: MemoryItem) -> str:
    tags = f" (tags: {', '.join(item.tags)})" if item.tags else ""
    day = item.created_at.date().isoformat()
    return f"- id {item.id} [{item.scope}, {day}]{tags}: {item.content}"


async def _off_loop(fn: Callable[[], T]) -> T:
    return await _THREADS.run(fn)


# --- the tools -----------------------------------------------------------------------------


class MemoryTool:
    """One of the three memory tools."""

    def __init__(self, spec: ToolSpec) -> None:
        self._spec = spec

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        invocation, policy = _caller(context, self._spec.name)
        if self._spec.name == SEARCH:
            return await self._search(arguments, invocation, policy)
        if not policy.write:
            raise ToolError(
                f"{self._spec.name} is off: the role's harness "
                f"{_setting(invocation, 'memory.write')} is false, so it may not change memory."
            )
        if self._spec.name == SAVE:
            return await self._save(arguments, invocation, policy, context.call_key)
        return await self._delete(arguments, invocation, policy)

    async def _search(
        self, arguments: dict[str, Any], invocation: Invocation, policy: MemoryPolicy
    ) -> ToolResult:
        if not policy.enabled:
            raise ToolError(
                f"memory_search is off: the role's harness "
                f"{_setting(invocation, 'memory.enabled')} is false."
            )
        if not policy.max_items:
            raise ToolError(
                f"memory_search may return nothing: the role's harness "
                f"{_setting(invocation, 'memory.maxItems')} is 0."
            )
        scope = arguments.get("scope")
        if scope is not None:
            _scope_allowed(invocation, policy, str(scope))
        scopes = {str(scope)} if scope is not None else policy.scopes
        limit = min(int(arguments.get("limit") or policy.max_items), policy.max_items)
        query = str(arguments["query"])

        def search() -> list[MemoryItem]:
            found = memory_search(
                query,
                employee=invocation.employee,
                user=invocation.user,
                scopes=scopes,
                limit=limit,
            )
            memory_uses_record(found, "searched", origin_of(invocation))
            return found

        found = await _off_loop(search)
        if not found:
            return ToolResult(f'No memory matches "{query}".')
        count = "1 memory item matches" if len(found) == 1 else f"{len(found)} memory items match"
        lines = [f'{count} "{query}", best first:']
        return ToolResult("\n".join([*lines, *map(item_line, found)]))

    async def _save(
        self, arguments: dict[str, Any], invocation: Invocation, policy: MemoryPolicy, key: str
    ) -> ToolResult:
        scope = str(arguments.get("scope") or MemoryItemScope.AGENT_USER)
        _scope_allowed(invocation, policy, scope)
        origin = origin_of(invocation)
        save = functools.partial(
            memory_save_once,
            call_key=key,
            origin=origin,
            scope=scope,
            username="" if scope == MemoryItemScope.PUBLIC else invocation.user,
            employee=invocation.employee if scope == MemoryItemScope.AGENT_USER else "",
            content=str(arguments["content"]),
            tags=[str(t) for t in arguments.get("tags") or []],
            created_by=origin.actor,
            source_run=origin.run_id,
        )
        try:
            item, created = await _off_loop(save)
        except InvalidInput as exc:
            raise ToolError(f"Not saved: {exc.detail}") from exc
        again = "" if created else " (this call had saved it already; it was not saved twice)"
        return ToolResult(f"Saved memory item {item.id} in scope {item.scope}{again}.")

    async def _delete(
        self, arguments: dict[str, Any], invocation: Invocation, policy: MemoryPolicy
    ) -> ToolResult:
        try:
            item_id = uuid.UUID(str(arguments["id"]))
        except ValueError as exc:
            raise ToolError("id must be a memory item's id (a UUID).") from exc
        scopes = {s for s in policy.scopes if s == MemoryItemScope.PUBLIC or invocation.user}

        def delete() -> MemoryItem | None:
            visible = memory_visible(
                employee=invocation.employee, user=invocation.user, scopes=scopes
            )
            item = visible.filter(pk=item_id).first()
            if item is not None:
                memory_delete(item)
            return item

        item = await _off_loop(delete)
        if item is None:
            raise ToolError(
                f"No memory item {item_id} that you can see (under the role's harness "
                f"{_setting(invocation, 'memory.scopes')}: {', '.join(sorted(scopes)) or 'none'})."
            )
        return ToolResult(f"Deleted memory item {item_id} ({item.scope}).")

"""``todo``: the agent's own task list within one invocation (seed 000).

The model adds items, updates their status (``pending``, ``in_progress``, ``completed``,
``cancelled``) or title, and reads the list; every call answers with the whole list as JSON.
Effect ``read``: it changes nothing outside the invocation.

The list lives in the invocation's history: each call's result holds the whole list, so when an
invocation is resumed (a crash, an approval) the list is restored from the last finished
``todo`` step of its journal (:func:`runtime.tools.subagents.current_scope`). A sub-agent has
its own invocation, hence its own list: it never sees or changes its parent's.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from typing import Any

from runtime.invocation import StepRecord
from runtime.tools.base import ToolContext, ToolError, ToolResult
from runtime.tools.scope import current_scope
from runtime.types import Effect, ToolSpec

TODO_TOOL = "todo"
_FINISHED = frozenset({"completed", "failed"})
STATUSES = ("pending", "in_progress", "completed", "cancelled")
MAX_ITEMS = 100
MAX_TITLE = 500
#: Lists of invocations that run without a scope (kept for the latest ones only).
_UNSCOPED_KEEP = 256

TODO_SPEC = ToolSpec(
    name=TODO_TOOL,
    description=(
        "Your own task list for this piece of work. Add items, update their status "
        "(pending, in_progress, completed, cancelled) or title, or call with no arguments to "
        "see the list. Every call returns the whole list."
    ),
    parameters={
        "type": "object",
        "properties": {
            "add": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": MAX_TITLE},
                "maxItems": MAX_ITEMS,
                "description": "Titles of new items (status pending).",
            },
            "update": {
                "type": "array",
                "maxItems": MAX_ITEMS,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer", "minimum": 1},
                        "status": {"type": "string", "enum": list(STATUSES)},
                        "title": {"type": "string", "minLength": 1, "maxLength": MAX_TITLE},
                    },
                    "required": ["id"],
                    "additionalProperties": False,
                },
                "description": "Changes to existing items, by id.",
            },
        },
        "additionalProperties": False,
    },
    effect=Effect.READ,
)


def todos_of(content: str) -> list[dict[str, Any]] | None:
    """The list a ``todo`` result holds (None when ``content`` is not one)."""
    try:
        value, _ = json.JSONDecoder().raw_decode(content)
    except ValueError:
        return None
    items = value.get("todos") if isinstance(value, dict) else None
    return items if isinstance(items, list) else None


def restored(steps: list[StepRecord]) -> list[dict[str, Any]]:
    """The list as the last finished ``todo`` step of an invocation left it."""
    for step in reversed(steps):
        if step.kind != "tool" or step.name != TODO_TOOL or step.status not in _FINISHED:
            continue
        if step.error:
            continue
        response = step.response
        content = response.get("content") if isinstance(response, dict) else response
        items = todos_of(content) if isinstance(content, str) else None
        if items is not None:
            return [dict(item) for item in items]
    return []


class TodoTool:
    """The ``todo`` tool; its state is per invocation (see the module docstring)."""

    def __init__(self) -> None:
        self._unscoped: OrderedDict[tuple[str, str], list[dict[str, Any]]] = OrderedDict()
        self._lock = asyncio.Lock()

    @property
    def spec(self) -> ToolSpec:
        return TODO_SPEC

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        async with self._lock:
            items = await self._items(context)
            changed = _apply(items, arguments)
            body = {"todos": items}
            text = json.dumps(body, ensure_ascii=False)
            done = sum(1 for item in items if item["status"] == "completed")
            summary = f"{len(items)} item(s), {done} completed" + (
                f"; {changed} change(s)" if changed else ""
            )
            return ToolResult(f"{text}\n{summary}")

    async def _items(self, context: ToolContext) -> list[dict[str, Any]]:
        scope = current_scope()
        if scope is not None:
            items = scope.state.get(TODO_TOOL)
            if items is None:
                items = restored(await scope.journal.steps())
                scope.state[TODO_TOOL] = items
            return list_of(items)
        invocation = context.invocation
        key = (str(invocation.run_id), invocation.name) if invocation else ("", "")
        items = self._unscoped.setdefault(key, [])
        self._unscoped.move_to_end(key)
        while len(self._unscoped) > _UNSCOPED_KEEP:
            self._unscoped.popitem(last=False)
        return items


def list_of(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise TypeError("todo state must be a list")
    return value


def _apply(items: list[dict[str, Any]], arguments: dict[str, Any]) -> int:
    """Apply the call's changes to ``items`` in place (all or nothing); returns how many."""
    by_id = {int(item["id"]): item for item in items}
    updates = list(arguments.get("update") or [])
    for update in updates:
        if int(update["id"]) not in by_id:
            known = ", ".join(str(i) for i in by_id) or "none yet"
            raise ToolError(f"No todo item {update['id']}; the ids are: {known}.")
    added = list(arguments.get("add") or [])
    if len(items) + len(added) > MAX_ITEMS:
        raise ToolError(f"The list holds at most {MAX_ITEMS} items; finish or cancel some first.")
    for update in updates:
        item = by_id[int(update["id"])]
        if "status" in update:
            item["status"] = update["status"]
        if "title" in update:
            item["title"] = update["title"]
    next_id = max(by_id, default=0) + 1
    for offset, title in enumerate(added):
        items.append({"id": next_id + offset, "title": title, "status": "pending"})
    return len(updates) + len(added)

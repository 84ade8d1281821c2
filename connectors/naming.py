"""How MCP tools are named to agents, and what their annotations mean to the harness. Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from harness.planner import MCP_PREFIX as PREFIX
from runtime.types import Effect

__all__ = ["PREFIX", "effect_of", "offered_name"]
#: What OpenAI-compatible APIs accept as a function name (runtime.tools.registry).
_OFFERED = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def offered_name(server: str, tool: str) -> str | None:
    """``mcp__<server>__<tool>``, or None when the tool's name cannot be offered that way (the
    whole name must be 1-64 letters, digits, ``_`` or ``-``)."""
    name = f"{PREFIX}{server}__{tool}"
    return name if _OFFERED.match(name) else None


def effect_of(annotations: Mapping[str, Any]) -> Effect:
    """The effect tier of a tool from its MCP annotations (hints, as the server states them):
    ``readOnlyHint`` → read, ``destructiveHint`` → external (high-risk), otherwise write."""
    if annotations.get("readOnlyHint") is True:
        return Effect.READ
    if annotations.get("destructiveHint") is True:
        return Effect.EXTERNAL
    return Effect.WRITE

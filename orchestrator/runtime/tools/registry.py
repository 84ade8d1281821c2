"""The tool registry: every tool a loop could offer, before policy narrows it down."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from jsonschema import Draft202012Validator

from orchestrator.runtime.tools.base import Tool
from orchestrator.runtime.types import ToolSpec

#: What OpenAI-compatible APIs accept as a function name.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ToolRegistry:
    """Tools by name. Registration checks the name and the parameter schema up front, so a
    broken tool fails at start-up rather than in the middle of a run."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        spec = tool.spec
        if not _NAME.match(spec.name):
            raise ValueError(f"Tool name {spec.name!r} must match {_NAME.pattern}")
        if spec.name in self._tools:
            raise ValueError(f"A tool named {spec.name!r} is already registered")
        if spec.parameters.get("type") != "object":
            raise ValueError(f"Tool {spec.name!r}: parameters must be a JSON Schema object")
        Draft202012Validator.check_schema(spec.parameters)
        self._tools[spec.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def specs(self) -> list[ToolSpec]:
        return [tool.spec for tool in self._tools.values()]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())


def tool_schema(spec: ToolSpec) -> dict[str, Any]:
    """The Chat Completions ``tools`` entry for a tool."""
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        },
    }

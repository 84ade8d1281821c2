"""The tool registry: every tool a loop could offer, before policy narrows it down."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

from jsonschema import Draft202012Validator

from runtime.policy import decision_of
from runtime.tools.base import Tool
from runtime.types import ToolSpec

#: What OpenAI-compatible APIs accept as a function name.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ToolProvider(Protocol):
    """Tools whose set changes while the service runs (Skill Hub skills, one tool per skill):
    looked up by name and listed per loop, after the registered tools."""

    def get(self, name: str) -> Tool | None: ...

    def specs(self) -> list[ToolSpec]: ...

    def review_gates(self, names: Iterable[str]) -> dict[str, tuple[str, str]]:
        """``("ask", reason)`` for each of its tools among ``names`` whose every call a person
        must review, whatever the harness plan says."""
        ...


_PROVIDERS: list[ToolProvider] = []


def tool_provider_register(provider: ToolProvider) -> None:
    """Make ``provider`` part of the production registry (``tool_providers()``); an app's
    ``ready()`` calls it once."""
    if provider not in _PROVIDERS:
        _PROVIDERS.append(provider)


def tool_providers() -> tuple[ToolProvider, ...]:
    return tuple(_PROVIDERS)


def provider_review_gates(
    decisions: Mapping[str, Any], providers: Iterable[ToolProvider] | None = None
) -> dict[str, tuple[str, str]]:
    """The ``ask`` decisions the providers (default: the registered ones) impose on the tools of
    a plan's ``decisions``; a ``deny`` stays a deny. Applied last, so no allowlist waives them."""
    gates: dict[str, tuple[str, str]] = {}
    for provider in tool_providers() if providers is None else providers:
        gates.update(provider.review_gates(decisions))
    return {n: g for n, g in gates.items() if decision_of(decisions[n]) != "deny"}


class ToolRegistry:
    """Tools by name. Registration checks the name and the parameter schema up front, so a
    broken tool fails at start-up rather than in the middle of a run. ``providers`` add
    dynamic tools behind the registered ones (opt-in: test registries stay exactly theirs)."""

    def __init__(
        self, tools: Iterable[Tool] = (), *, providers: Iterable[ToolProvider] = ()
    ) -> None:
        self._tools: dict[str, Tool] = {}
        self._providers = tuple(providers)
        for tool in tools:
            self.register(tool)

    def with_providers(self, providers: Iterable[ToolProvider]) -> ToolRegistry:
        """The same tools plus ``providers``."""
        return ToolRegistry(self._tools.values(), providers=[*self._providers, *providers])

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
        tool = self._tools.get(name)
        for provider in self._providers if tool is None else ():
            if (tool := provider.get(name)) is not None:
                break
        return tool

    def names(self) -> list[str]:
        return [spec.name for spec in self.specs()]

    def specs(self) -> list[ToolSpec]:
        specs = [tool.spec for tool in self._tools.values()]
        for provider in self._providers:
            specs.extend(s for s in provider.specs() if s.name not in self._tools)
        return specs

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __iter__(self) -> Iterator[Tool]:
        if not self._providers:
            return iter(self._tools.values())
        return iter([t for s in self.specs() if (t := self.get(s.name)) is not None])


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

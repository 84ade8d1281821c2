"""The tool registry: registration checks and the Chat Completions schema of a tool."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from jsonschema.exceptions import SchemaError

from runtime.tools import ToolRegistry, tool_schema
from runtime.tools.registry import provider_review_gates
from runtime.types import ToolSpec
from tests.support.fake_model import RecordingTool


def test_tools_are_found_by_name_in_registration_order() -> None:
    registry = ToolRegistry([RecordingTool("b"), RecordingTool("a")])
    assert registry.names() == ["b", "a"]
    assert "a" in registry
    assert registry.get("a") is not None
    assert registry.get("missing") is None


def test_a_name_the_api_would_reject_is_refused_at_registration() -> None:
    with pytest.raises(ValueError, match="must match"):
        ToolRegistry([RecordingTool("read file")])


def test_two_tools_with_one_name_are_refused() -> None:
    with pytest.raises(ValueError, match="already registered"):
        ToolRegistry([RecordingTool("read"), RecordingTool("read")])


def test_parameters_must_be_a_valid_object_schema() -> None:
    with pytest.raises(ValueError, match="JSON Schema object"):
        ToolRegistry([RecordingTool("x", parameters={"type": "string"})])
    with pytest.raises(SchemaError):
        ToolRegistry([RecordingTool("x", parameters={"type": "object", "required": "path"})])


def test_tool_schema_is_a_chat_completions_function() -> None:
    spec = RecordingTool("read").spec
    assert tool_schema(spec) == {
        "type": "function",
        "function": {
            "name": "read",
            "description": "test tool read",
            "parameters": {"type": "object", "properties": {}},
        },
    }


class _ReviewedProvider:
    """A provider whose ``reviewed`` tools a person must approve call by call."""

    def __init__(self, *reviewed: str) -> None:
        self.reviewed = reviewed

    def get(self, name: str) -> None:
        return None

    def specs(self) -> list[ToolSpec]:
        return []

    def review_gates(self, names: Iterable[str]) -> dict[str, tuple[str, str]]:
        return {n: ("ask", f"review {n}") for n in names if n in self.reviewed}


def test_provider_review_gates_turn_allow_into_ask_and_leave_a_deny() -> None:
    decisions = {"a": ("allow", "plan"), "b": "deny", "c": "allow"}
    gates = provider_review_gates(decisions, [_ReviewedProvider("a", "b"), _ReviewedProvider()])
    assert gates == {"a": ("ask", "review a")}
    assert provider_review_gates(decisions, []) == {}

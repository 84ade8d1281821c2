"""The declared spec (name, schema, effect) of any tool a run can be offered: the builtin file
tools, ``bash``, ``dispatch_sub_agent_task``, ``todo`` and the registered providers' tools,
whether or not this process offers them."""

from __future__ import annotations

from runtime.tools.bash import BASH_SPEC
from runtime.tools.files import builtin_registry
from runtime.tools.registry import ToolRegistry, tool_providers
from runtime.tools.subagents import SUB_AGENT_SPEC
from runtime.tools.todo import TODO_SPEC
from runtime.types import ToolSpec

_BUILTIN_SPECS = {
    spec.name: spec for spec in [*builtin_registry().specs(), BASH_SPEC, SUB_AGENT_SPEC, TODO_SPEC]
}


def tool_spec(name: str) -> ToolSpec | None:
    """The spec of tool ``name`` (for an approval's re-check); None for no such tool."""
    if name in _BUILTIN_SPECS:
        return _BUILTIN_SPECS[name]
    provided = ToolRegistry(providers=tool_providers()).get(name)
    return None if provided is None else provided.spec

"""Tools the loop can offer: the registry, the tool protocol and the builtin file tools."""

from __future__ import annotations

from runtime.tools.base import Tool, ToolContext, ToolError, ToolResult
from runtime.tools.files import (
    EditTool,
    FileToolConfig,
    ListTool,
    ReadTool,
    WriteTool,
    builtin_file_tools,
    builtin_registry,
)
from runtime.tools.ledger import DirectoryLedger, EffectLedger, MemoryLedger
from runtime.tools.registry import ToolRegistry, tool_schema
from runtime.tools.workspace import DEFAULT_DENY_PATTERNS

__all__ = [
    "DEFAULT_DENY_PATTERNS",
    "DirectoryLedger",
    "EditTool",
    "EffectLedger",
    "FileToolConfig",
    "ListTool",
    "MemoryLedger",
    "ReadTool",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "ToolResult",
    "WriteTool",
    "builtin_file_tools",
    "builtin_registry",
    "tool_schema",
]

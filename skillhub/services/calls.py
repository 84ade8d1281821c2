"""The MCP-style surface as plain services: list the skills a caller sees as MCP tools, and call
one, returning MCP content with a manifest of output files. Used by the REST actions
(``mcpListTools`` / ``mcpCallTool``) and by the real MCP server (``skillhub.mcp``)."""

from __future__ import annotations

import json
from typing import Any

from skillhub.models import TOOL_PREFIX, Skill
from skillhub.services.access import Caller, skill_network, skill_visible
from skillhub.services.executions import (
    execution_request,
    execution_summary,
    execution_wait,
)
from skillhub.services.skills import skill_get

#: Beyond the skill's own timeout, how long a synchronous caller waits for a worker to pick
#: the execution up.
QUEUE_GRACE_SECONDS = 30.0


def skills_visible(caller: Caller) -> list[Skill]:
    return [s for s in Skill.objects.filter(enabled=True) if skill_visible(s, caller)]


#: ``structuredContent`` of every call that is not an error: :func:`execution_summary`.
EXECUTION_SUMMARY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "execution_id": {"type": "string", "format": "uuid"},
        "tool_name": {"type": "string"},
        "status": {"type": "string", "enum": ["queued", "running", "succeeded", "failed"]},
        "exit_code": {"type": ["integer", "null"]},
        "timed_out": {"type": "boolean"},
        "killed_reason": {"type": ["string", "null"]},
        "duration_ms": {"type": ["integer", "null"]},
        "stdout": {"type": "string"},
        "stderr": {"type": "string"},
        "stdout_truncated": {"type": "boolean"},
        "error": {"type": ["string", "null"]},
        "output_files": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "size": {"type": "integer"},
                    "downloadable": {"type": "boolean"},
                },
                "required": ["name", "size", "downloadable"],
            },
        },
    },
    "required": ["execution_id", "tool_name", "status", "stdout", "output_files"],
}


def mcp_annotations(skill: Skill, caller: Caller) -> dict[str, Any]:
    """MCP ``ToolAnnotations`` from the skill's declared effect (``auto_call``: read, else
    write) and the network its sandbox gets for ``caller`` (closed world when denied)."""
    annotations: dict[str, Any] = {"title": skill.title, "readOnlyHint": skill.auto_call}
    if not skill.auto_call:
        # A write skill's program may change or delete anything it reaches: MCP's defaults
        # (destructive, not idempotent), stated.
        annotations |= {"destructiveHint": True, "idempotentHint": False}
    annotations["openWorldHint"] = skill_network(caller) != "deny"
    return annotations


def mcp_tool(skill: Skill, caller: Caller) -> dict[str, Any]:
    """One MCP tool: name, description, input and output schemas, annotations."""
    return {
        "name": skill.tool_name,
        "description": skill.description or skill.title,
        "inputSchema": skill.input_schema,
        "outputSchema": EXECUTION_SUMMARY_SCHEMA,
        "annotations": mcp_annotations(skill, caller),
    }


def mcp_list_tools(caller: Caller) -> list[dict[str, Any]]:
    """``tools/list``: the enabled skills visible to the caller as MCP tools."""
    return [mcp_tool(s, caller) for s in skills_visible(caller)]


def skill_for_call(name: str) -> Skill:
    """A skill by its tool name, also accepting the agent form ``skill_hub_<name>``."""
    if name.startswith(TOOL_PREFIX):
        name = name[len(TOOL_PREFIX) :]
    return skill_get(tool_name=name)


def mcp_content(summary: dict[str, Any]) -> dict[str, Any]:
    """MCP ``CallToolResult`` fields for an execution summary: the output as text, then the
    manifest of output files; ``isError`` unless the program succeeded."""
    ok = summary["status"] == "succeeded"
    text = summary["stdout"] if ok else _failure_text(summary)
    manifest = {"execution_id": summary["execution_id"], "output_files": summary["output_files"]}
    return {
        "content": [
            {"type": "text", "text": text},
            {"type": "text", "text": "output files: " + json.dumps(manifest)},
        ],
        "isError": not ok,
        "structuredContent": summary,
    }


def _failure_text(summary: dict[str, Any]) -> str:
    parts = [f"Skill {summary['tool_name']} {summary['status']}"]
    if summary.get("error"):
        parts.append(str(summary["error"]))
    if summary.get("stderr"):
        parts.append("stderr:\n" + str(summary["stderr"])[-4000:])
    if summary.get("stdout"):
        parts.append("stdout:\n" + str(summary["stdout"])[-4000:])
    return "\n".join(parts)


def mcp_call_tool(*, name: str, arguments: Any, caller: Caller, origin: str) -> dict[str, Any]:
    """``tools/call``: run the skill and wait for its result (timeout + a grace period)."""
    skill = skill_for_call(name)
    execution = execution_request(skill=skill, inputs=arguments, caller=caller, origin=origin)
    finished = execution_wait(
        execution_id=execution.id, timeout=skill.timeout_seconds + QUEUE_GRACE_SECONDS
    )
    return mcp_content(execution_summary(finished))

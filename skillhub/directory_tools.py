"""Skills directories for the model (docs/skill-directories.md): the ``<available_skills>``
block of an employee's system prompt and the ``skill`` tool that loads a skill's instructions.

:class:`SkillCataloguePrompt` is a ``runtime.prompt_context`` provider: for an employee that
binds the ``skill`` tool (its ``tools`` list: the request's ``employee_tools`` when the caller
read its profile, else one indexed read) and that some directory lists,
it gives ``name: description`` of each skill it may load (instructions are not inlined).
:class:`DirectorySkillToolProvider` is a :class:`~runtime.tools.registry.ToolProvider` with the
one ``skill`` tool, a read: it answers with the instructions of a skill of a directory that
lists the calling employee (``ToolContext.invocation``); another name is a tool error naming
the allowed ones. Both read the database on a worker thread (never in the event loop).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from orchestrator.dbpool import db_call
from orchestrator.dbthreads import OffLoopDb
from runtime.invocation import InvocationRequest
from runtime.tools.base import Tool, ToolContext, ToolError, ToolResult
from runtime.types import Effect, ToolSpec
from skillhub.models import DIRECTORY_SKILL_NAME
from skillhub.services.directories import allowed_skills, employee_binds, skill_instructions

SKILL_TOOL = "skill"
#: Most skills named in the prompt block (the tool error lists them all the same way).
MAX_PROMPT_SKILLS = 200
_DESCRIPTION_CHARS = 300
_THREADS = OffLoopDb("skill-directories")

SKILL_SPEC = ToolSpec(
    name=SKILL_TOOL,
    description=(
        "Load the instructions of one of the skills listed under <available_skills> in your "
        "system prompt, by its name. Call it before doing a task a skill describes, then "
        "follow the instructions it returns."
    ),
    parameters={
        "type": "object",
        "properties": {
            "name": {
                "type": "string",
                "pattern": DIRECTORY_SKILL_NAME,
                "description": "The skill's name, as listed under <available_skills>.",
            }
        },
        "required": ["name"],
        "additionalProperties": False,
    },
    effect=Effect.READ,
)


def catalogue_block(employee: str) -> str:
    """The ``<available_skills>`` block of ``employee`` ("" when it may load none)."""
    skills = allowed_skills(employee)
    if not skills:
        return ""
    lines = [
        "<available_skills>",
        f"Call the `{SKILL_TOOL}` tool with a skill's name to load its instructions before "
        "doing what it describes.",
    ]
    for skill in skills[:MAX_PROMPT_SKILLS]:
        lines.append(f"- {skill.name}: {skill.description[:_DESCRIPTION_CHARS]}")
    if len(skills) > MAX_PROMPT_SKILLS:
        lines.append(f"(and {len(skills) - MAX_PROMPT_SKILLS} more)")
    lines.append("</available_skills>")
    return "\n".join(lines)


class SkillCataloguePrompt:
    """The skills catalogue of every employee that binds the ``skill`` tool."""

    async def prompt_block(self, request: InvocationRequest) -> str:
        block = functools.partial(self.prompt_block_here, request)
        if request.conversation is not None:
            return await db_call(block)
        return await _THREADS.run(block)

    def prompt_block_here(self, request: InvocationRequest) -> str:
        tools = request.employee_tools
        binds = (
            SKILL_TOOL in tools
            if tools is not None
            else employee_binds(request.employee_username, SKILL_TOOL)
        )
        if not binds:
            return ""
        return catalogue_block(request.employee_username)


def _load(employee: str, name: str) -> tuple[str, list[str]]:
    """The answer for ``name`` ("" when not allowed) and the names ``employee`` may load."""
    found = skill_instructions(employee, name)
    if found is None:
        return "", [s.name for s in allowed_skills(employee)]
    where = f"{found.directory.key}:{found.source_path}"
    return f'<skill name="{found.name}" source="{where}">\n{found.instructions}\n</skill>', []


class DirectorySkillTool:
    @property
    def spec(self) -> ToolSpec:
        return SKILL_SPEC

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        invocation = context.invocation
        if invocation is None:
            raise ToolError(f"{SKILL_TOOL} runs only inside a run or a chat, for an AI employee.")
        name = str(arguments.get("name") or "").strip()
        answer, allowed = await _THREADS.run(functools.partial(_load, invocation.employee, name))
        if answer:
            return ToolResult(answer)
        listed = ", ".join(allowed[:MAX_PROMPT_SKILLS]) if allowed else "none"
        raise ToolError(
            f"There is no skill {name!r} you may load. The skills you may load: {listed}."
        )


class DirectorySkillToolProvider:
    """The ``skill`` tool of the production registry."""

    def get(self, name: str) -> Tool | None:
        return DirectorySkillTool() if name == SKILL_TOOL else None

    def specs(self) -> list[ToolSpec]:
        return [SKILL_SPEC]

    def review_gates(self, names: Iterable[str]) -> dict[str, tuple[str, str]]:
        return {}  # a read: the harness plan decides


SKILL_DIRECTORY_TOOLS = DirectorySkillToolProvider()
SKILL_CATALOGUE_PROMPT = SkillCataloguePrompt()

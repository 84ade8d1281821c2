"""Skill Hub skills as agent tools: ``skill_hub_execute`` and one ``skill_hub_<toolName>`` per
enabled skill (docs/skills.md).

:class:`SkillToolProvider` is a :class:`~runtime.tools.registry.ToolProvider`
(registered by the skillhub app). The loop asks for specs and tools from the event loop, where
Django's ORM may not run, so the provider reads the skills in a worker thread and keeps the
list for ``CACHE_SECONDS``: a new or changed skill reaches running loops within that time.

A call knows who is calling from its context (``ToolContext.invocation``, plain data the loop
sets: the run, the employee, its role's harness settings, the tools it binds and the pattern's
autoAllowlist), never from a row; a call whose context has no invocation is refused. The skill
then goes through the same service as the API (scope and harness check, input validation, rate
limit, execution row, ``skills`` queue), keyed by the call's idempotency key, so a call
re-issued after a crash finds its execution instead of running the program twice. The tool
waits for the result until its own deadline.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any

from orchestrator.dbthreads import OffLoopDb
from orchestrator.errors import DomainError
from runtime.tools.base import Invocation, Tool, ToolContext, ToolError, ToolResult
from runtime.types import Effect, ToolSpec
from skillhub.models import Skill
from skillhub.services.access import Caller, skill_tool_spec
from skillhub.services.calls import QUEUE_GRACE_SECONDS
from skillhub.services.executions import (
    execution_request,
    execution_summary,
    execution_wait_async,
)
from skillhub.services.skills import skill_get

EXECUTE = "skill_hub_execute"
PREFIX = "skill_hub_"
CACHE_SECONDS = 2.0
#: Output shown to the model (the loop cuts it further at ``maxToolOutputLength``).
_OUTPUT_CHARS = 20_000

_EXECUTE_SPEC = ToolSpec(
    name=EXECUTE,
    description=(
        "Run a Skill Hub skill (a sandboxed Python or Node.js program) by its toolName with "
        "inputs matching its input schema. Prefer the skill's own skill_hub_<toolName> tool "
        "when it is offered; returns the program's output and a list of its output files."
    ),
    parameters={
        "type": "object",
        "properties": {
            "toolName": {"type": "string", "description": "The skill's toolName."},
            "inputs": {"type": "object", "description": "Inputs for the skill's input schema."},
        },
        "required": ["toolName"],
        "additionalProperties": False,
    },
    effect=Effect.WRITE,
)
_THREADS = OffLoopDb("skill-tools")


class SkillToolProvider:
    """The skill tools of the production registry."""

    def __init__(self, cache_seconds: float = CACHE_SECONDS) -> None:
        self.cache_seconds = cache_seconds
        self._lock = threading.Lock()
        self._specs: dict[str, ToolSpec] = {}
        self._reviews: dict[str, str] = {}
        self._loaded_at = float("-inf")

    def _load(self) -> None:
        with self._lock:
            if time.monotonic() - self._loaded_at > self.cache_seconds:
                self._specs, self._reviews = _THREADS.blocking(_load_specs)
                self._loaded_at = time.monotonic()

    def _skill_specs(self) -> dict[str, ToolSpec]:
        self._load()
        return self._specs

    def review_gates(self, names: Iterable[str]) -> dict[str, tuple[str, str]]:
        """``ask`` decisions for the skill tools among ``names`` whose skill requires human
        review (skillLoopConfigs); the reason carries the review prompt."""
        wanted = [n for n in names if n.startswith(PREFIX) and n != EXECUTE]
        if not wanted:
            return {}
        self._load()
        return {
            name: ("ask", f"Skill review required: {self._reviews[name]}".strip())
            for name in wanted
            if name in self._reviews
        }

    def specs(self) -> list[ToolSpec]:
        return [_EXECUTE_SPEC, *self._skill_specs().values()]

    def get(self, name: str) -> Tool | None:
        if name == EXECUTE:
            return SkillExecuteTool()
        if not name.startswith(PREFIX):
            return None
        spec = self._skill_specs().get(name)
        return None if spec is None else SkillTool(spec)

    def invalidate(self) -> None:
        with self._lock:
            self._loaded_at = float("-inf")


def _load_specs() -> tuple[dict[str, ToolSpec], dict[str, str]]:
    """The skills' tool specs, each with the forms of its review (a gated call's input form;
    a reviewed skill's review schema), and the review prompts of the reviewed skills."""
    specs, reviews = {}, {}
    for skill in Skill.objects.filter(enabled=True).select_related("loop_config"):
        spec = skill_tool_spec(skill)
        config = getattr(skill, "loop_config", None)
        if config is not None and not config.requires_review:
            config = None
        form = skill.interaction_schema
        spec = dataclasses.replace(
            spec,
            interaction_schema=form if isinstance(form, dict) and form else dict(spec.parameters),
            review_schema=config.review_schema if config is not None else None,
        )
        specs[spec.name] = spec
        if config is not None:
            reviews[spec.name] = config.review_prompt or "a person approves each call"
    return specs, reviews


class SkillTool:
    """``skill_hub_<toolName>``: one skill, its input schema as the tool's parameters."""

    def __init__(self, spec: ToolSpec) -> None:
        self._spec = spec

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        return await skill_call(self._spec.name[len(PREFIX) :], arguments, context, generic=False)


class SkillExecuteTool:
    """``skill_hub_execute``: any skill visible to the caller, by name."""

    @property
    def spec(self) -> ToolSpec:
        return _EXECUTE_SPEC

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        name = str(arguments.get("toolName") or "")
        if name.startswith(PREFIX):
            name = name[len(PREFIX) :]
        return await skill_call(name, arguments.get("inputs") or {}, context, generic=True)


#: The answer to a skill call made outside a run (its context carries no invocation).
NO_INVOCATION = "Skill tools run only inside a loop run; this call has none."


def _caller_of(invocation: Invocation) -> Caller:
    """The employee calling, from the invocation the call's context carries (plain data set
    by the loop: no row is read, so the call works whenever its model step is written). Its
    access to the skill is then checked from this and the skill's own rows."""

    return Caller.for_employee(
        invocation.employee,
        harness=invocation.harness,
        bound_tools=invocation.bound_tools,
        run_id=invocation.run_id,
        auto_allowlist=invocation.auto_allowlist,
    )


def _request(
    name: str, inputs: Any, key: str, invocation: Invocation, generic: bool
) -> tuple[str, float]:
    caller = _caller_of(invocation)
    try:
        skill = skill_get(tool_name=name)
        execution = execution_request(
            skill=skill, inputs=inputs, caller=caller, origin="agent",
            idempotency_key=key, generic=generic,
        )  # fmt: skip
    except DomainError as exc:
        raise ToolError(_problem_text(exc)) from exc
    return str(execution.id), float(skill.timeout_seconds) + QUEUE_GRACE_SECONDS


def _problem_text(exc: Any) -> str:
    errors = exc.extra.get("errors") or []
    details = "; ".join(f"{e['pointer']}: {e['detail']}" for e in errors[:5])
    return f"{exc.detail}" + (f" ({details})" if details and details not in exc.detail else "")


async def skill_call(name: str, inputs: Any, context: ToolContext, *, generic: bool) -> ToolResult:
    """Request the execution (thread), then wait for its result without blocking the loop."""
    if context.invocation is None:  # refused before anything reaches the database
        raise ToolError(NO_INVOCATION)
    key, invocation = context.idempotency_key, context.invocation
    requested = functools.partial(_request, name, inputs, key, invocation, generic)
    execution_id, wait = await _THREADS.run(requested)
    execution = await execution_wait_async(
        execution_id=uuid.UUID(execution_id),
        timeout=min(wait, context.remaining()),
        cancelled=context.cancelled,
    )
    summary = await _THREADS.run(lambda: execution_summary(execution))
    return _result(summary)


def _result(summary: dict[str, Any]) -> ToolResult:
    files = summary["output_files"]
    manifest = f"\n\nOutput files of execution {summary['execution_id']}: {json.dumps(files)}"
    if summary["status"] == "succeeded":
        return ToolResult(summary["stdout"][-_OUTPUT_CHARS:] + (manifest if files else ""))
    if summary["status"] in ("queued", "running"):
        raise ToolError(
            f"Skill {summary['tool_name']} did not finish in time (execution "
            f"{summary['execution_id']} is {summary['status']}); no skills worker may be running."
        )
    parts = [f"Skill {summary['tool_name']} failed: {summary['error'] or 'no reason given'}"]
    if summary["stderr"]:
        parts.append("stderr:\n" + summary["stderr"][-4000:])
    if summary["stdout"]:
        parts.append("stdout:\n" + summary["stdout"][-4000:])
    return ToolResult("\n".join(parts), is_error=True)


#: The provider instance the skillhub app registers (one cache per process).
SKILL_TOOLS = SkillToolProvider()

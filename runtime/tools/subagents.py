"""``dispatch_sub_agent_task``: an employee hands a task to an employee bound to it.

A sub-agent is an isolated tool loop run inside the parent's tool call (docs/sub-agents.md):

* **isolated history**: the child's conversation starts from its own system prompt and the task
  (plus the ``context`` the parent passes), never the parent's messages;
* **lower step cap**: ``min(child.max_steps, step_cap)``; **the parent's deadline**: the child
  ends before the parent's call times out, and the parent's cancellation stops it;
* **depth**: travels with the invocation's name (``maker:0/sub:3.0/sub:5.1`` is depth 2); a call
  beyond the harness ``delegation.maxDepth`` is refused with a tool error, and so is the
  ``delegation.maxCount``-th-plus-one call of an invocation, or a child outside
  ``delegation.allowedEmployees`` or not bound to the parent;
* **alternatives**: when the child's model fails, the binding's alternatives run in order;
* **usage**: the child's model steps go through a child journal (``StepJournal.sub_journal`` when
  the parent's journal has one: the engine's persists them as the steps of the invocation
  ``<parent>/sub:<n>`` of the same run, charged to its budgets, and resumes them like any
  invocation; otherwise an in-memory :class:`EphemeralJournal`), and the scope's ``usage`` sink
  hears of every token, so a request-scoped caller merges it into its own usage;
* **distilled conclusion**: the child's final answer, trimmed, is the tool's result.

The tool's effect is ``write``: a child may be given the file writers, never a tool that needs
a human (an ``ask`` of the child's plan is a deny) nor an ``external`` one.

Nothing here imports Django: a :class:`SubAgentHost` (``orchestrator.agents.subagent_host``)
knows the bindings and builds a child's tool loop pieces.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from runtime.invocation import (
    InvocationOutcome,
    InvocationRequest,
    LoopRole,
    OutcomeKind,
    RetryLater,
    RoleInvoker,
    RunHalted,
    StepJournal,
)
from runtime.policy import Decision, ToolPolicy, ToolRule
from runtime.scrub import ScrubbingJournal, redact_patterns
from runtime.tools.base import Invocation, ToolContext, ToolError, ToolResult
from runtime.tools.ephemeral import EphemeralJournal
from runtime.tools.scope import (
    SUB_MARK,
    EventSink,
    InvocationScope,
    MeteredJournal,
    child_journal,
    current_scope,
    emit,
    invocation_scope,
    invoke_scoped,
)
from runtime.types import Effect, ModelCallFailed, ToolSpec

T = TypeVar("T")

SUB_AGENT_TOOL = "dispatch_sub_agent_task"
#: Model steps a sub-agent may take at most (the delegation cap), whatever its own max_steps.
DEFAULT_STEP_CAP = 8
#: Characters of the child's answer the parent gets back.
DEFAULT_CONCLUSION_CHARS = 8_000
#: Time kept back from the parent's deadline, so the child ends before the parent's call does.
_DEADLINE_MARGIN = 0.25

SUB_AGENT_SPEC = ToolSpec(
    name=SUB_AGENT_TOOL,
    description=(
        "Hand a self-contained task to another AI employee bound to you as a sub-agent. It "
        "starts from nothing but the task and the context you give (it cannot see this "
        "conversation), works with its own tools under a lower step limit, and returns its "
        "conclusion. Use it for a well-defined piece of work."
    ),
    parameters={
        "type": "object",
        "properties": {
            "employee": {
                "type": "string",
                "description": "Username of the bound employee to hand the task to.",
            },
            "task": {
                "type": "string",
                "minLength": 1,
                "description": "What the sub-agent must do, complete and self-contained.",
            },
            "context": {
                "type": "string",
                "description": "Facts the sub-agent needs (it sees nothing else of yours).",
            },
        },
        "required": ["employee", "task"],
        "additionalProperties": False,
    },
    effect=Effect.WRITE,
)


def sub_agent_depth(invocation_name: str) -> int:
    """How deep an invocation is nested: 0 for a role invocation, 1 for its sub-agents, ..."""
    return invocation_name.count(SUB_MARK)


# --- what the host provides -------------------------------------------------------------------


@dataclass(frozen=True)
class BoundSubAgent:
    """A child the parent may dispatch to, with the other employees to try when it fails and
    an optional model override (the host applies it when it builds the child)."""

    child: str
    alternatives: tuple[str, ...] = ()
    model: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ChildLimits:
    """What the dispatch allows the child: at most ``max_steps`` model steps (its own cap is
    lowered to it, never raised) and ``seconds`` of wall clock (the parent's deadline)."""

    max_steps: int
    seconds: float


@dataclass(frozen=True)
class SubAgentChild:
    """A bound employee ready to run as a sub-agent.

    ``invoker`` is its tool loop built under the :class:`ChildLimits` it was asked for, with
    :func:`child_policy` over its tool plan (``runtime.sub_agent_loop.child_tool_loop`` does
    both)."""

    employee: str
    invoker: RoleInvoker
    #: The harness snapshot the child's request carries (``{"settings", "provenance", ...}``).
    harness: Mapping[str, Any]
    #: Values masked in whatever the child's journal persists (its endpoint keys).
    secrets: tuple[str, ...] = ()


class SubAgentHost(Protocol):
    """Knows the bindings and builds children (``orchestrator.agents.subagent_host``)."""

    async def bindings(self, parent: str) -> list[BoundSubAgent]:
        """The children bound to employee ``parent``, in a stable order."""
        ...

    async def child(
        self, parent: Invocation, employee: str, binding: BoundSubAgent, limits: ChildLimits
    ) -> SubAgentChild:
        """Build ``employee`` (the binding's child or one of its alternatives) to run under
        ``parent``'s harness within ``limits``; raises :class:`ToolError` when it cannot."""
        ...


# --- the tool ---------------------------------------------------------------------------------


def _delegation(invocation: Invocation) -> tuple[dict[str, Any], Mapping[str, str]]:
    settings = invocation.harness or {}
    return dict(settings.get("delegation") or {}), invocation.harness_provenance or {}


def _named(field_name: str, value: Any, provenance: Mapping[str, str]) -> str:
    layer = provenance.get(f"delegation.{field_name}", "platform")
    return f"delegation.{field_name} = {json.dumps(value)} (set by {layer})"


def _allowed(employee: str, allowed: list[str]) -> bool:
    return "*" in allowed or employee in allowed


def child_policy(policy: ToolPolicy, effects: Mapping[str, Effect]) -> ToolPolicy:
    """A sub-agent's tool policy from its plan: nothing waits for a human (``ask`` becomes a
    deny) and no ``external`` tool runs (``effects``: tool name -> effect), since the dispatch
    tool's own effect is ``write``; the reasons say why."""
    rules = {}
    for name, rule in policy.rules.items():
        if rule.decision is Decision.ASK:
            why = f"a sub-agent cannot wait for a human approval ({rule.reason or 'ask'})"
            rule = ToolRule(Decision.DENY, why)
        if rule.decision is not Decision.DENY and effects.get(name) == Effect.EXTERNAL:
            rule = ToolRule(Decision.DENY, "a sub-agent gets no external (high-risk) tool")
        rules[name] = rule
    return ToolPolicy(rules)


@dataclass(frozen=True)
class _ChildRun:
    outcome: InvocationOutcome
    employee: str
    name: str
    tokens_in: int
    tokens_out: int
    cost: float


class DispatchSubAgentTool:
    """The ``dispatch_sub_agent_task`` tool over a :class:`SubAgentHost`."""

    def __init__(
        self,
        host: SubAgentHost,
        *,
        step_cap: int = DEFAULT_STEP_CAP,
        conclusion_chars: int = DEFAULT_CONCLUSION_CHARS,
    ) -> None:
        self.host = host
        self.step_cap = step_cap
        self.conclusion_chars = conclusion_chars

    @property
    def spec(self) -> ToolSpec:
        return SUB_AGENT_SPEC

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        parent = context.invocation
        if parent is None:
            raise ToolError("Sub-agents run only inside an employee's invocation; this has none.")
        employee = str(arguments["employee"])
        task = str(arguments["task"])
        given = str(arguments.get("context") or "")
        delegation, provenance = _delegation(parent)
        depth = sub_agent_depth(parent.name) + 1
        max_depth = int(delegation.get("maxDepth", 0))
        if depth > max_depth:
            raise ToolError(
                f"Refused: this would be a sub-agent at depth {depth}, beyond "
                f"{_named('maxDepth', max_depth, provenance)}. Do the work yourself."
            )
        allowed = list(delegation.get("allowedEmployees") or [])
        if not _allowed(employee, allowed):
            named = _named("allowedEmployees", allowed, provenance)
            raise ToolError(f"Refused: {employee!r} is not in {named}.")
        bindings = await self.host.bindings(parent.employee)
        binding = next((b for b in bindings if b.child == employee), None)
        if binding is None:
            bound = ", ".join(b.child for b in bindings) or "none"
            raise ToolError(
                f"Refused: {employee!r} is not bound to {parent.employee} as a sub-agent. "
                f"Bound employees: {bound}."
            )
        scope = current_scope()
        journal = scope.journal if scope is not None else EphemeralJournal()
        await self._count(scope, journal, context.idempotency_key, delegation, provenance)
        task_id = _task_id(context.idempotency_key)
        base = f"{parent.name}{SUB_MARK}{task_id}"
        await emit(
            scope,
            {"type": "sub_agent_started", "task_id": task_id, "depth": depth, "employee": employee},
        )
        started = time.monotonic()
        run = await self._run_candidates(
            parent, binding, journal, base, task, given, context, scope, depth
        )
        await emit(
            scope,
            {
                "type": "sub_agent_finished",
                "task_id": task_id,
                "depth": depth,
                "employee": run.employee,
                "outcome": str(run.outcome.kind),
                "duration_ms": int((time.monotonic() - started) * 1000),
                "usage": {
                    "prompt_tokens": run.tokens_in,
                    "completion_tokens": run.tokens_out,
                    "cost": run.cost,
                },
            },
        )
        return self._result(run)

    async def _count(
        self,
        scope: InvocationScope | None,
        journal: StepJournal,
        key: str,
        delegation: dict[str, Any],
        provenance: Mapping[str, str],
    ) -> None:
        """Take one of the invocation's ``maxCount`` sub-agent calls (a re-issued call keeps
        its own); refuses past the limit."""
        limit = int(delegation.get("maxCount", 0))
        if scope is None:
            if limit < 1:
                raise ToolError(f"Refused: {_named('maxCount', limit, provenance)}.")
            return
        async with scope.lock:
            if scope.dispatched is None:
                # Calls that ran before this scope (a resume): finished, not refused. Calls of
                # the current step are begun but not finished: each counts itself below.
                scope.dispatched = {
                    s.idempotency_key
                    for s in await journal.steps()
                    if s.kind == "tool"
                    and s.name == SUB_AGENT_TOOL
                    and s.idempotency_key
                    and s.status in ("completed", "failed")
                    and not _refused(s.response)
                }
            if key in scope.dispatched:
                return
            if len(scope.dispatched) >= limit:
                raise ToolError(
                    f"Refused: {_named('maxCount', limit, provenance)} and this invocation has "
                    f"dispatched {len(scope.dispatched)} sub-agent task(s)."
                )
            scope.dispatched.add(key)

    async def _run_candidates(
        self,
        parent: Invocation,
        binding: BoundSubAgent,
        journal: StepJournal,
        base: str,
        task: str,
        given: str,
        context: ToolContext,
        scope: InvocationScope | None,
        depth: int,
    ) -> _ChildRun:
        failures: list[str] = []
        candidates = [binding.child, *binding.alternatives]
        for index, employee in enumerate(candidates):
            name = base if index == 0 else f"{base}~{index}"
            remaining = context.remaining()
            seconds = remaining - min(_DEADLINE_MARGIN, remaining / 10)
            if seconds <= 0:
                raise ToolError("No time is left of this call's deadline for a sub-agent.")
            limits = ChildLimits(max_steps=self.step_cap, seconds=seconds)
            try:
                child = await self.host.child(parent, employee, binding, limits)
            except ToolError as exc:
                failures.append(f"{employee}: {exc}")
                continue
            run = await self._run_child(
                parent, child, journal, name, task, given, context, scope, depth, seconds
            )
            if run.outcome.code != "model_unavailable":
                return run
            failures.append(f"{employee}: {run.outcome.reason}")
        raise ToolError(
            "The sub-agent could not run; every employee tried failed: " + "; ".join(failures)
        )

    async def _run_child(
        self,
        parent: Invocation,
        child: SubAgentChild,
        journal: StepJournal,
        name: str,
        task: str,
        given: str,
        context: ToolContext,
        scope: InvocationScope | None,
        depth: int,
        budget: float,
    ) -> _ChildRun:
        request = InvocationRequest(
            run_id=parent.run_id,
            role=LoopRole(parent.role),
            invocation=name,
            employee_username=child.employee,
            goal=task,
            harness=dict(child.harness),
            context={"auto_allowlist": sorted(parent.auto_allowlist)},
            inputs={"context": given} if given else {},
            workdir=context.workdir,
            user=parent.user,
        )
        sub = await child_journal(journal, name)
        patterns = redact_patterns(child.harness.get("settings"))
        if child.secrets or patterns:
            sub = ScrubbingJournal(sub, child.secrets, patterns)
        metered = MeteredJournal(sub, scope, depth, name)
        try:
            async with asyncio.timeout(budget):
                with invocation_scope(
                    metered,
                    events=_tagged(scope, depth, name),
                    usage=scope.usage if scope else None,
                    autonomy_level=scope.autonomy_level if scope else None,
                ):
                    outcome = await child.invoker.invoke(request, metered)
        except TimeoutError:
            outcome = InvocationOutcome(
                kind=OutcomeKind.FAILED,
                code="deadline",
                reason=f"the sub-agent ran out of its parent's time ({budget:.1f} s)",
            )
        except (RetryLater, ModelCallFailed) as exc:
            outcome = InvocationOutcome(
                kind=OutcomeKind.FAILED, code="model_unavailable", reason=str(exc)
            )
        except RunHalted as halt:
            # A run limit stopped the child; the parent's next step meets it too and the run
            # stops there, so the child's call ends with the reason rather than the run here.
            outcome = InvocationOutcome(
                kind=OutcomeKind.FAILED, code=halt.code, reason=f"stopped: {halt.reason}"
            )
        return _ChildRun(
            outcome, child.employee, name, metered.tokens_in, metered.tokens_out, metered.cost
        )

    def _result(self, run: _ChildRun) -> ToolResult:
        outcome = run.outcome
        head = f"Sub-agent {run.employee} ({run.name})"
        if outcome.kind is OutcomeKind.COMPLETED:
            text = outcome.output.get("text")
            answer = text if isinstance(text, str) else json.dumps(outcome.output)
            return ToolResult(f"{head} concluded:\n{_trimmed(answer, self.conclusion_chars)}")
        if outcome.kind is OutcomeKind.NEEDS_APPROVAL:
            return ToolResult(f"{head} stopped: it needed a human approval.", is_error=True)
        reason = outcome.reason or outcome.code or str(outcome.kind)
        return ToolResult(f"{head} did not conclude: {reason}", is_error=True)


def _refused(response: Any) -> bool:
    """A finished sub-agent step refused before any child ran (it does not count)."""
    content = response.get("content") if isinstance(response, dict) else None
    return isinstance(content, str) and content.startswith("Error: Refused")


def _trimmed(text: str, limit: int) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[:limit].rstrip() + f"\n[conclusion trimmed: {len(text) - limit} more characters]"


def _task_id(key: str) -> str:
    """A stable id of the call from its idempotency key (``<run>:<seq>:<index>`` → ``seq.index``):
    the same when a started call is re-issued after a crash, so its child resumes."""
    parts = key.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        return f"{parts[1]}.{parts[2]}"
    return uuid.uuid4().hex[:12]


def _tagged(scope: InvocationScope | None, depth: int, name: str) -> EventSink | None:
    """The child's events go to the parent's sink tagged with its task id and depth."""
    if scope is None or scope.events is None:
        return None
    task_id = name.rsplit(SUB_MARK, 1)[-1]

    async def sink(event: dict[str, Any]) -> None:
        await emit(scope, {"task_id": task_id, "depth": depth, **event})

    return sink


__all__ = [
    "SUB_AGENT_SPEC",
    "SUB_AGENT_TOOL",
    "BoundSubAgent",
    "ChildLimits",
    "DispatchSubAgentTool",
    "SubAgentChild",
    "SubAgentHost",
    "child_policy",
    "current_scope",
    "invocation_scope",
    "invoke_scoped",
    "sub_agent_depth",
]

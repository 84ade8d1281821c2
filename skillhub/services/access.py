"""Who may see and run a skill (SkillAccessService), and what network its sandbox gets.

People (REST API, MCP) are checked by role: any role lists skills, running one needs the
operator role. AI employees are checked by the skill's ``tool_scope`` and by the harness
snapshot of the role they play in the run:

* ``general``: every employee; ``specified``: only the employees the skill names;
  ``custom``: only employees that bind the skill's own tool ``skill_hub_<toolName>``.
* The harness tool plan for ``skill_hub_<toolName>`` must allow it. Through the generic
  ``skill_hub_execute`` a plan of ``ask`` is refused too (the call must go through the skill's
  own tool, where the loop's approval gate applies), so the generic tool cannot bypass a gate
  (unless the run pattern's ``autoAllowlist`` waives that gate, as it does for the tool itself).
* The sandbox's network is the harness's ``isolation.networkAccess``: ``allow`` the host
  network, ``restricted`` HTTP(S) to ``isolation.allowedHosts`` only (through the allowlisting
  egress proxy, ``runtime.egress_proxy``), anything else or no harness ``deny``. People running a
  skill themselves get ``deny``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.planner import plan_tools
from orchestrator.accounts.roles import Role, has_role, user_roles
from orchestrator.errors import DomainError
from runtime.types import Effect, ToolSpec
from skillhub.models import Skill, SkillLoopConfig, ToolScope


class SkillForbidden(DomainError):
    status_code = 403
    problem_type = "skill-forbidden"
    title = "Skill not allowed"


class SkillRateLimited(DomainError):
    status_code = 429
    problem_type = "rate-limited"
    title = "Too many skill executions"


@dataclass(frozen=True)
class Caller:
    """Who asks: a person (``user``) or an AI employee in a run (``employee``)."""

    principal: str
    user: Any = None
    employee: str | None = None
    #: The compiled harness settings of the employee's role in the run.
    harness: Mapping[str, Any] | None = None
    #: The tools the employee binds (its ``tools`` list).
    bound_tools: frozenset[str] = field(default_factory=frozenset)
    run_id: uuid.UUID | None = None
    #: The run pattern's ``approvals.autoAllowlist``: tools whose ``ask`` is waived.
    auto_allowlist: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def for_user(cls, user: Any) -> Caller:
        return cls(principal=f"user:{getattr(user, 'username', '') or 'anonymous'}", user=user)

    @classmethod
    def for_employee(
        cls,
        username: str,
        *,
        harness: Mapping[str, Any] | None,
        bound_tools: frozenset[str],
        run_id: uuid.UUID | None = None,
        auto_allowlist: frozenset[str] = frozenset(),
    ) -> Caller:
        return cls(
            principal=f"employee:{username}",
            employee=username,
            harness=harness,
            bound_tools=bound_tools,
            run_id=run_id,
            auto_allowlist=auto_allowlist,
        )


def skill_tool_spec(skill: Skill) -> ToolSpec:
    """The per-skill agent tool as the registry and the harness planner see it."""
    effect = Effect.READ if skill.auto_call else Effect.WRITE
    description = skill.description or skill.title
    if skill.instructions:
        description = f"{description}\n\n{skill.instructions}"
    return ToolSpec(
        name=skill.agent_tool_name,
        description=description[:1024],
        parameters=dict(skill.input_schema),
        effect=effect,
    )


def skill_visible(skill: Skill, caller: Caller) -> bool:
    """Whether the skill is listed for this caller (enabled and in scope)."""
    if not skill.enabled:
        return False
    if caller.employee is None:
        return bool(user_roles(caller.user))
    if skill.tool_scope == ToolScope.GENERAL:
        return True
    if skill.tool_scope == ToolScope.SPECIFIED:
        return caller.employee in (skill.employees or [])
    return skill.agent_tool_name in caller.bound_tools


def _harness_decision(skill: Skill, harness: Mapping[str, Any]) -> tuple[str, str]:
    decisions = plan_tools(harness, [skill_tool_spec(skill)]).decisions()
    value = decisions.get(skill.agent_tool_name, ("deny", "not planned"))
    if isinstance(value, tuple):
        return str(value[0]), str(value[1])
    return str(value), ""


def skill_access_check(skill: Skill, caller: Caller, *, generic: bool = False) -> None:
    """Raise SkillForbidden (403) with the reason when ``caller`` may not run ``skill``."""
    if not skill.enabled:
        raise SkillForbidden(f"Skill {skill.tool_name!r} is disabled.")
    if caller.employee is None:
        if not has_role(caller.user, Role.OPERATOR):
            raise SkillForbidden("Running a skill needs the operator role.")
        return
    if not skill_visible(skill, caller):
        raise SkillForbidden(
            f"Skill {skill.tool_name!r} (scope {skill.tool_scope}) is not available to "
            f"employee {caller.employee!r}."
        )
    if caller.harness is None:
        raise SkillForbidden("No harness snapshot for this call: skills are denied.")
    decision, reason = _harness_decision(skill, caller.harness)
    if decision == "deny":
        raise SkillForbidden(f"The harness denies {skill.agent_tool_name}: {reason}")
    if generic and _requires_review(skill):
        raise SkillForbidden(
            f"Skill {skill.tool_name!r} requires human review; call {skill.agent_tool_name} "
            "directly so the call can be reviewed."
        )
    if decision == "ask" and generic and skill.agent_tool_name not in caller.auto_allowlist:
        raise SkillForbidden(
            f"The harness requires approval for {skill.agent_tool_name}; call that tool "
            "directly so the call can be reviewed."
        )


def _requires_review(skill: Skill) -> bool:
    return SkillLoopConfig.objects.filter(skill=skill, requires_review=True).exists()


def skill_network(caller: Caller) -> str:
    """The sandbox network mode the caller's harness grants: ``allow``, ``restricted`` (see
    :func:`skill_allowed_hosts`) or ``deny`` (also without a harness)."""
    return skill_egress(caller)[0]


def skill_allowed_hosts(caller: Caller) -> tuple[str, ...]:
    """The hosts a ``restricted`` sandbox may reach (``isolation.allowedHosts``); () otherwise."""
    return skill_egress(caller)[1]


def skill_egress(caller: Caller) -> tuple[str, tuple[str, ...]]:
    isolation = (caller.harness or {}).get("isolation") or {}
    if not isinstance(isolation, Mapping):
        return "deny", ()
    mode = isolation.get("networkAccess")
    if mode == "allow":
        return "allow", ()
    if mode == "restricted":
        hosts = isolation.get("allowedHosts") or ()
        return "restricted", tuple(str(h) for h in hosts if isinstance(h, str))
    return "deny", ()

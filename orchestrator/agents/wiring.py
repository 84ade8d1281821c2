"""An AI employee wired to the tool loop: its profile (model client, prompt, tools, limits), the
tool registry every employee draws from, and the harness policy over its tools.

Both ways in use this: durable runs (``loops.worker.invoker.AgentInvoker``) and the
request-scoped OpenAI-compatible endpoint (``gateway``). The employee is read once per
configuration (:class:`ProfileCache`); the tool plan comes from a compiled harness snapshot.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from harness.autonomy import autonomy_gates, plan_effects
from harness.planner import plan_tools
from instructions.rendering import render as render_prompt_text
from orchestrator.agents.clients import (
    employee_endpoint_config,
    employee_get,
    loop_settings_for_employee,
    model_client_for_employee,
    route_target_config,
)
from orchestrator.agents.models import Employee, ModelEndpoint, SubAgentBinding
from orchestrator.agents.quotas import EmployeeQuota
from orchestrator.agents.routing import (
    ModelRoute,
    RouteTable,
    RouteTarget,
    parse_rules,
    rule_targets,
)
from orchestrator.errors import NotFound
from orchestrator.sql import fetch_one_prepared
from runtime.breaker import CircuitBreaker
from runtime.invocation import InvocationRequest, LoopRole
from runtime.loop import LoopSettings, ToolLoopInvoker
from runtime.policy import ToolPolicy, decision_of
from runtime.prompt_context import prompt_blocks
from runtime.prompt_template import has_placeholders
from runtime.prompts import default_system_prompt
from runtime.scrub import secret_values
from runtime.secrets import Secret, SecretNotAllowed, api_key_from_env
from runtime.tools import DirectoryLedger, FileToolConfig, ToolRegistry, builtin_registry
from runtime.tools.bash import BashConfig, bash_tool
from runtime.tools.registry import provider_review_gates, tool_providers
from runtime.tools.subagents import SUB_AGENT_TOOL
from runtime.types import Effect, ModelClient, ToolSpec


@dataclass(frozen=True)
class EmployeeProfile:
    """What one invocation needs from the employee's rows, read once."""

    username: str
    system_prompt: str
    tools: tuple[str, ...]
    loop_settings: LoopSettings
    client: ModelClient
    #: The API keys of the employee's endpoint chain, masked in whatever the run persists.
    secrets: tuple[str, ...] = ()
    #: The employee's harness fields: a published profile (``tag`` / ``tag@N``, blank: none)
    #: and its inline layer (``{}``: none).
    harness_tag: str = ""
    harness_layer: dict[str, Any] | None = None
    #: Usernames of the employees bound to this one as sub-agents (``dispatch_sub_agent_task``
    #: is offered only when there are any).
    sub_agents: tuple[str, ...] = ()
    #: Few-shot messages sent after the system prompt (the employee's ``preset_messages``).
    preset_messages: tuple[dict[str, Any], ...] = ()
    #: The employee's endpoint, and whether it accepts image content parts.
    endpoint_name: str = ""
    vision: bool = False
    #: The employee's daily token and cost quotas (``quotas.EmployeeQuota.binds``: any set).
    quota: EmployeeQuota | None = None
    #: The employee's model alias (docs/model-routing.md); None: every call uses ``client``.
    routes: RouteTable | None = None

    def route(self, *, role: str, pattern: str = "") -> ModelRoute:
        """Where a call of ``role`` in a run of ``pattern`` ("" outside runs) goes: the alias
        rule that matches it, else the employee's own endpoint chain."""
        if self.routes is not None:
            routed = self.routes.route(pattern=pattern, role=role)
            if routed is not None:
                return routed
        return ModelRoute(
            client=self.client,
            endpoint_name=self.endpoint_name,
            vision=self.vision,
            context_window=self.loop_settings.context_window_tokens,
        )


def _route_table(employee: Employee, breaker: CircuitBreaker | None) -> RouteTable | None:
    alias = employee.model_alias
    if alias is None:
        return None
    rules = parse_rules(alias.rules)
    targets = {
        endpoint.name: RouteTarget(
            config=route_target_config(endpoint, employee),
            vision=endpoint.vision,
            context_window=endpoint.context_window,
            prices=(endpoint.input_price_per_token, endpoint.output_price_per_token),
        )
        for endpoint in ModelEndpoint.objects.filter(name__in=rule_targets(rules))
    }
    return RouteTable(
        alias=alias.name,
        rules=rules,
        targets=targets,
        build_client=lambda config: model_client_for_employee(
            employee, breaker=breaker, config=config
        ),
    )


def _read_profile(username: str, breaker: CircuitBreaker | None) -> EmployeeProfile:
    employee: Employee = employee_get(username=username)
    routes = _route_table(employee, breaker)
    chains = [employee_endpoint_config(employee)]
    if routes is not None:
        chains += [target.config for target in routes.targets.values()]
    return EmployeeProfile(
        username=employee.username,
        system_prompt=employee.system_prompt,
        tools=tuple(employee.tools or ()),
        loop_settings=loop_settings_for_employee(employee),
        client=model_client_for_employee(employee, breaker=breaker),
        secrets=secret_values(
            [_allowed_key(c.api_key_env) for chain in chains for c in chain.chain()]
        ),
        harness_tag=employee.harness_tag,
        harness_layer=dict(employee.harness or {}),
        sub_agents=tuple(
            SubAgentBinding.objects.filter(parent=employee).values_list(
                "child__username", flat=True
            )
        ),
        preset_messages=tuple(employee.preset_messages or ()),
        endpoint_name=employee.endpoint.name,
        vision=employee.endpoint.vision,
        quota=EmployeeQuota(
            employee.username, employee.daily_token_quota, employee.daily_cost_quota
        ),
        routes=routes,
    )


def _allowed_key(env_name: str) -> Secret | None:
    """The key to scrub from the run's records; None for a name the secret rule refuses (the
    model client never reads it, so that endpoint fails and the chain fails over)."""
    try:
        return api_key_from_env(env_name)
    except SecretNotAllowed:
        return None


#: When the employee, its endpoint, its failover chain and its sub-agent bindings last
#: changed: one short query, so a worker reuses a profile (and its model client) until the
#: configuration changes.
#: What an employee's profile is read from, as SQL columns over ``agents_employee e`` joined
#: with its endpoint ``agents_modelendpoint ep``: a profile is current while these are unchanged.
PROFILE_SIGNATURE_COLUMNS = (
    "e.updated_at, ep.updated_at, "
    "(SELECT MAX(t.updated_at) FROM agents_failoverroute f "
    "JOIN agents_modelendpoint t ON t.id = f.target_id WHERE f.source_id = ep.id), "
    "(SELECT COUNT(*) FROM agents_failoverroute f WHERE f.source_id = ep.id), "
    "(SELECT COUNT(*) FROM agents_subagentbinding b WHERE b.parent_id = e.id), "
    "(SELECT MAX(b.created_at) FROM agents_subagentbinding b WHERE b.parent_id = e.id), "
    # An alias: its rules, and any endpoint they may name.
    "(SELECT a.updated_at FROM agents_modelalias a WHERE a.id = e.model_alias_id), "
    "CASE WHEN e.model_alias_id IS NULL THEN NULL "
    "ELSE (SELECT MAX(t.updated_at) FROM agents_modelendpoint t) END"
)
_SIGNATURE = (
    f"SELECT {PROFILE_SIGNATURE_COLUMNS} "  # noqa: S608 (constant text)
    "FROM agents_employee e JOIN agents_modelendpoint ep ON ep.id = e.endpoint_id "
    "WHERE e.username = %s"
)


class ProfileCache:
    """Employee profiles of one process, each kept while its configuration is unchanged.

    Every invocation still asks the database whether the employee, its endpoint or an endpoint
    of its failover chain changed (``_SIGNATURE``); only then is the profile read and its model
    client built again. A client built once per configuration also keeps its self-healing
    stream mode until the configuration changes."""

    def __init__(self, breaker: CircuitBreaker | None = None) -> None:
        #: The endpoint breaker of the profiles' model clients (None: the process's default).
        self.breaker = breaker
        self._profiles: dict[str, tuple[tuple[Any, ...], EmployeeProfile]] = {}
        self._lock = threading.Lock()

    def get(self, username: str) -> EmployeeProfile:
        """The profile of ``username`` (call on a thread with a database connection); raises
        NotFound for an unknown employee."""
        row = fetch_one_prepared("lw_profile_signature", _SIGNATURE, [username])
        if row is None:
            raise NotFound(f"No AI employee named {username}.")
        signature = tuple(row)
        with self._lock:
            known = self._profiles.get(username)
        if known is not None and known[0] == signature:
            return known[1]
        profile = _read_profile(username, self.breaker)
        with self._lock:
            self._profiles[username] = (signature, profile)
        return profile


def employee_tool_registry(ledger_dir: Path | None = None) -> ToolRegistry:
    """Every tool an employee may be given: the built-in file tools, the registered providers'
    tools (Skill Hub ``skill_hub_*``) and ``bash`` where the sandbox runs (absent elsewhere, so
    never offered)."""
    ledger = DirectoryLedger(ledger_dir or settings.VAR_DIR / "tool-ledger")
    tools = builtin_registry(FileToolConfig(ledger=ledger)).with_providers(tool_providers())
    if (bash := bash_tool(BashConfig(ledger=ledger))) is not None:
        tools.register(bash)
    return tools


def role_tool_policy(request: InvocationRequest, specs: list[ToolSpec]) -> ToolPolicy:
    """The harness plan of this role's snapshot over the employee's tools."""
    harness_settings = (request.harness or {}).get("settings")
    if harness_settings is None:
        # No snapshot means no policy: deny everything rather than guess.
        return ToolPolicy.from_decisions({s.name: ("deny", "no harness snapshot") for s in specs})
    if request.role == LoopRole.LEADER:
        specs = [s for s in specs if s.effect == Effect.READ]
    plan = plan_tools(harness_settings, specs)
    decisions: dict[str, Any] = plan.decisions()
    # The pattern's autoAllowlist skips the human gate, never a deny.
    for name in request.context.get("auto_allowlist") or []:
        if name in decisions and decision_of(decisions[name]) == "ask":
            decisions[name] = ("allow", "in the pattern's autoAllowlist")
    # The run's autonomy level decides which tiers may run without a human (no level: as L1),
    # whatever the plan trusts or the allowlist waives: the registration check, at the call.
    decisions = autonomy_gates(decisions, plan_effects(plan), request.context.get("autonomy_level"))
    # Tools a provider requires reviewed (Skill Hub skillLoopConfigs) always ask; the allowlist
    # cannot waive it.
    decisions.update(provider_review_gates(decisions))
    return ToolPolicy.from_decisions(decisions)


def employee_specs(profile: EmployeeProfile, tools: ToolRegistry) -> list[ToolSpec]:
    """The specs of the employee's tools that ``tools`` knows (unknown names are not offered;
    ``dispatch_sub_agent_task`` only to an employee with sub-agents bound)."""
    return [
        tool.spec
        for name in profile.tools
        if (tool := tools.get(name)) is not None and (name != SUB_AGENT_TOOL or profile.sub_agents)
    ]


async def employee_system_prompt(profile: EmployeeProfile, request: InvocationRequest) -> str:
    """The employee's own prompt (its placeholders rendered with the run's instruction pins,
    inputs and workspace: docs/prompts.md) above the runtime's default one, then the blocks the
    apps add (``runtime.prompt_context``: agent memory)."""
    base = default_system_prompt(request)
    own = profile.system_prompt
    if has_placeholders(own):
        rendered = await render_prompt_text(
            own, inputs=request.inputs, pins=request.instructions, workdir=request.workdir
        )
        own = rendered.text
    prompt = f"{own}\n\n{base}" if own else base
    blocks = request.prompt_blocks
    if blocks is None:
        blocks = tuple(
            await prompt_blocks(dataclasses.replace(request, employee_tools=profile.tools))
        )
    return "\n\n".join([prompt, *blocks])


def employee_tool_loop(
    profile: EmployeeProfile,
    tools: ToolRegistry,
    *,
    route: ModelRoute,
    client: ModelClient | None = None,
    policy: Callable[[InvocationRequest], ToolPolicy] | None = None,
) -> ToolLoopInvoker:
    """The tool loop with the routed model (``client`` when given: the route's, wrapped), the
    employee's prompt, limits and tools; the policy is the harness plan of each request's
    snapshot (:func:`role_tool_policy`) unless ``policy`` is given."""
    specs = employee_specs(profile, tools)
    model = client or route.client
    settings = profile.loop_settings
    if settings.context_window_tokens != route.context_window:
        settings = dataclasses.replace(settings, context_window_tokens=route.context_window)

    def harness_policy(request: InvocationRequest) -> ToolPolicy:
        return role_tool_policy(request, specs)

    return ToolLoopInvoker(
        model_clients=lambda _username: model,
        tools=tools,
        policy=policy or harness_policy,
        settings=settings,
        system_prompt=lambda request: employee_system_prompt(profile, request),
        # Carried by every call's ToolContext: skill tools check the employee's access
        # (a ``custom``-scope skill needs its tool bound) from it, not from a row.
        bound_tools=profile.tools,
        preset_messages=profile.preset_messages,
        vision=route.vision,
        endpoint_name=route.endpoint_name,
        route_label=route.label,
    )

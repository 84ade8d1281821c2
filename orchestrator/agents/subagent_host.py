"""The Django side of sub-agents: bindings from :class:`SubAgentBinding` rows, children built
from their employee rows (docs/sub-agents.md).

:class:`EmployeeSubAgentHost` is the :class:`runtime.tools.subagents.SubAgentHost` of both ways
in (durable runs and the OpenAI-compatible endpoint); :func:`agent_tools_register` adds
``dispatch_sub_agent_task`` and ``todo`` to an employee tool registry. A child runs under its
parent's compiled harness tightened by the child's own layers (``parent:<invocation>`` →
``employee:<child>:profile:<tag>@<N>`` → ``employee:<child>``), so it can never do more than its
parent's role allows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from asgiref.sync import sync_to_async

from harness.compile import harness_compile, layer_from_settings, profile_layer
from harness.schema import SettingsInvalid, layer_validate
from harness.services import ProfileNotFound, profile_version_resolve
from instructions.rendering import render_here
from orchestrator.agents.clients import (
    breaker_default,
    employee_get,
    endpoint_config_from_model,
    stream_mode_of,
)
from orchestrator.agents.models import SubAgentBinding
from orchestrator.agents.wiring import (
    EmployeeProfile,
    ProfileCache,
    employee_specs,
    role_tool_policy,
)
from orchestrator.errors import NotFound
from runtime.content_safety import inherited
from runtime.invocation import InvocationRequest, LoopRole
from runtime.model_client import client_for_endpoint
from runtime.model_config import ModelParams
from runtime.prompt_template import PromptTemplateError, has_placeholders
from runtime.sub_agent_loop import child_tool_loop, sub_agent_prompt
from runtime.tools.base import Invocation, ToolError
from runtime.tools.registry import ToolRegistry
from runtime.tools.subagents import (
    SUB_AGENT_TOOL,
    BoundSubAgent,
    ChildLimits,
    DispatchSubAgentTool,
    SubAgentChild,
    current_scope,
)
from runtime.tools.todo import TODO_TOOL, TodoTool
from runtime.types import ModelClient

T = TypeVar("T")


def _pooled(journal: Any) -> Any:
    """The journal (or the one it wraps) whose ``db_call`` runs on pooled database threads
    (``pooled_db``: the run driver's); None when there is none."""
    while journal is not None:
        if getattr(journal, "pooled_db", False):
            return journal
        journal = getattr(journal, "inner", None)
    return None


async def _db(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` off the event loop: on the run driver's pooled database threads when the
    invocation's journal has them, else Django's sync thread (whose connection Django
    manages), never a fresh thread that would leave its connection open."""
    scope = current_scope()
    pooled = _pooled(scope.journal) if scope is not None else None
    if pooled is not None:
        result: T = await pooled.db_call(fn, *args)
        return result
    return await sync_to_async(fn)(*args)


def bindings_of(parent: str) -> list[BoundSubAgent]:
    """The runtime's view of ``parent``'s binding rows, oldest first."""
    rows = (
        SubAgentBinding.objects.filter(parent__username=parent)
        .select_related("child", "endpoint")
        .order_by("created_at", "id")
    )
    return [
        BoundSubAgent(
            child=row.child.username,
            alternatives=tuple(str(a) for a in row.alternatives or ()),
            model=(
                {"endpoint": row.endpoint.name if row.endpoint else None, "model": row.model}
                if row.endpoint_id is not None or row.model
                else None
            ),
        )
        for row in rows
    ]


def _override_client(username: str, override: Mapping[str, Any]) -> ModelClient:
    """The child's model client with the binding's endpoint and/or model name."""
    employee = employee_get(username=username)
    endpoint = employee.endpoint
    name = override.get("endpoint")
    if name:
        found = type(endpoint).objects.filter(name=name).first()
        if found is None:
            raise NotFound(f"No model endpoint named {name}.")
        endpoint = found
    config = endpoint_config_from_model(
        endpoint, params_override=ModelParams.model_validate(employee.params)
    )
    if override.get("model"):
        config = dataclasses.replace(config, model=str(override["model"]))
    return client_for_endpoint(
        config, breaker=breaker_default(), stream_mode=stream_mode_of(employee)
    )


def child_harness(parent: Invocation, profile: EmployeeProfile) -> dict[str, Any]:
    """The child's snapshot: the parent's compiled settings as a layer, then the child
    employee's own layers; a field the parent's layer decided keeps the parent's provenance."""
    if parent.harness is None:
        return {}
    name = f"parent:{parent.name}"
    try:
        layers = [layer_from_settings(name, layer_validate(dict(parent.harness)))]
        if profile.harness_tag:
            own = profile_version_resolve(profile.harness_tag)
            own_name = f"employee:{profile.username}:profile:{own.profile.tag}@{own.version}"
            layers.append(profile_layer(own_name, layer_validate(own.settings)))
        if profile.harness_layer:
            layers.append(
                layer_from_settings(
                    f"employee:{profile.username}", layer_validate(profile.harness_layer)
                )
            )
    except (SettingsInvalid, ProfileNotFound) as exc:
        raise ToolError(f"The harness of sub-agent {profile.username} is invalid: {exc}") from exc
    compiled = harness_compile(layers)
    inherited = parent.harness_provenance or {}
    provenance = {
        path: inherited.get(path, layer) if layer == name else layer
        for path, layer in compiled.provenance.items()
    }
    return {
        "settings": compiled.settings_dict(),
        "provenance": provenance,
        "layers": [name, *compiled.layers[1:]],
    }


class EmployeeSubAgentHost:
    """Children are AI employees; bindings are :class:`SubAgentBinding` rows."""

    def __init__(self, tools: ToolRegistry, profiles: ProfileCache | None = None) -> None:
        self.tools = tools
        self.profiles = profiles or ProfileCache()

    async def bindings(self, parent: str) -> list[BoundSubAgent]:
        return await _db(bindings_of, parent)

    async def child(
        self, parent: Invocation, employee: str, binding: BoundSubAgent, limits: ChildLimits
    ) -> SubAgentChild:
        override = binding.model if employee == binding.child else None
        try:
            profile, harness, client = await _db(self._read, parent, employee, override)
        except NotFound as exc:
            raise ToolError(exc.detail) from exc
        except PromptTemplateError as exc:
            raise ToolError(f"sub-agent {employee}: system prompt: {exc}") from exc
        scope = current_scope()
        request = InvocationRequest(
            run_id=parent.run_id,
            role=LoopRole(parent.role),
            invocation=parent.name,
            employee_username=employee,
            goal="",
            harness=harness,
            context={
                "auto_allowlist": sorted(parent.auto_allowlist),
                "autonomy_level": scope.autonomy_level if scope else None,
                "pattern": parent.pattern,
            },
            user=parent.user,
        )
        policy = role_tool_policy(request, employee_specs(profile, self.tools))
        invoker = child_tool_loop(
            client=inherited(client, scope, label=f"{parent.name} > {employee}"),
            tools=self.tools,
            policy=policy,
            settings=profile.loop_settings,
            system_prompt=sub_agent_prompt(profile.system_prompt),
            limits=limits,
            bound_tools=profile.tools,
        )
        return SubAgentChild(
            employee=employee, invoker=invoker, harness=harness, secrets=profile.secrets
        )

    def _read(
        self, parent: Invocation, employee: str, override: Mapping[str, Any] | None
    ) -> tuple[EmployeeProfile, dict[str, Any], ModelClient]:
        profile = self.profiles.get(employee)
        if has_placeholders(profile.system_prompt):  # the run's pinned instructions, no inputs
            own = render_here(profile.system_prompt, pins=parent.instructions).text
            profile = dataclasses.replace(profile, system_prompt=own)
        if override:
            client = _override_client(employee, override)
        else:
            client = profile.route(role="sub_agent", pattern=parent.pattern).client
        return profile, child_harness(parent, profile), client


def agent_tools_register(tools: ToolRegistry, profiles: ProfileCache | None = None) -> ToolRegistry:
    """Add ``dispatch_sub_agent_task`` (over :class:`EmployeeSubAgentHost`) and ``todo`` to
    ``tools`` (an employee tool registry); returns it. Children draw from the same registry."""
    if SUB_AGENT_TOOL not in tools:
        tools.register(DispatchSubAgentTool(EmployeeSubAgentHost(tools, profiles)))
    if TODO_TOOL not in tools:
        tools.register(TodoTool())
    return tools

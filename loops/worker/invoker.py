"""The production :class:`~runtime.invocation.RoleInvoker`: the durable
tool loop, configured per invocation from the AI employee's row and the run's harness snapshot.

The employee is read once per invocation (off the event loop); the tool plan comes from the
role's compiled harness snapshot, so a published policy change never affects a running run.
The leader only ever gets read-effect tools: it plans and changes nothing.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection

from harness.planner import plan_tools
from orchestrator.agents.clients import (
    employee_endpoint_config,
    employee_get,
    model_client_for_employee,
)
from orchestrator.agents.models import Employee
from orchestrator.errors import NotFound
from runtime.invocation import (
    InvocationOutcome,
    InvocationRequest,
    LoopRole,
    OutcomeKind,
    StepJournal,
)
from runtime.loop import LoopSettings, ToolLoopInvoker
from runtime.policy import ToolPolicy, decision_of
from runtime.prompts import default_system_prompt
from runtime.scrub import ScrubbingJournal, scrub_outcome, secret_values
from runtime.secrets import Secret, SecretNotAllowed, api_key_from_env
from runtime.tools import (
    DirectoryLedger,
    FileToolConfig,
    ToolRegistry,
    builtin_registry,
)
from runtime.tools.bash import BashConfig, bash_tool, network_access
from runtime.tools.registry import provider_review_gates, tool_providers
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


def _read_profile(username: str) -> EmployeeProfile:
    employee: Employee = employee_get(username=username)
    return EmployeeProfile(
        username=employee.username,
        system_prompt=employee.system_prompt,
        tools=tuple(employee.tools or ()),
        loop_settings=LoopSettings(
            max_steps=employee.max_steps,
            tool_concurrency=employee.tool_concurrency,
            tool_timeout_seconds=employee.tool_timeout_seconds,
            max_tool_output_chars=employee.max_tool_output_length,
            context_window_tokens=employee.endpoint.context_window,
        ),
        client=model_client_for_employee(employee),
        secrets=secret_values(
            [_allowed_key(c.api_key_env) for c in employee_endpoint_config(employee).chain()]
        ),
    )


def _allowed_key(env_name: str) -> Secret | None:
    """The key to scrub from the run's records; None for a name the secret rule refuses (the
    model client never reads it, so that endpoint fails and the chain fails over)."""
    try:
        return api_key_from_env(env_name)
    except SecretNotAllowed:
        return None


#: When the employee, its endpoint and its failover chain last changed: one short query, so a
#: worker reuses a profile (and its model client) until the configuration changes.
_SIGNATURE = (
    "SELECT e.updated_at, ep.updated_at, "
    "(SELECT MAX(t.updated_at) FROM agents_failoverroute f "
    "JOIN agents_modelendpoint t ON t.id = f.target_id WHERE f.source_id = ep.id), "
    "(SELECT COUNT(*) FROM agents_failoverroute f WHERE f.source_id = ep.id) "
    "FROM agents_employee e JOIN agents_modelendpoint ep ON ep.id = e.endpoint_id "
    "WHERE e.username = %s"
)


class ProfileCache:
    """Employee profiles of one worker process, each kept while its configuration is unchanged.

    Every invocation still asks the database whether the employee, its endpoint or an endpoint
    of its failover chain changed (``_SIGNATURE``); only then is the profile read and its model
    client built again. A client built once per configuration also keeps its self-healing
    stream mode until the configuration changes."""

    def __init__(self) -> None:
        self._profiles: dict[str, tuple[tuple[Any, ...], EmployeeProfile]] = {}
        self._lock = threading.Lock()

    def get(self, username: str) -> EmployeeProfile:
        """The profile of ``username`` (call on a thread with a database connection)."""
        with connection.cursor() as cursor:
            cursor.execute(_SIGNATURE, [username])
            row = cursor.fetchone()
        if row is None:
            raise NotFound(f"No AI employee named {username}.")
        signature = tuple(row)
        with self._lock:
            known = self._profiles.get(username)
        if known is not None and known[0] == signature:
            return known[1]
        profile = _read_profile(username)
        with self._lock:
            self._profiles[username] = (signature, profile)
        return profile


async def _profile_for(
    profiles: ProfileCache, username: str, journal: StepJournal
) -> EmployeeProfile:
    """Read on the journal's database threads (the run driver's pooled connections)."""
    profile: EmployeeProfile = await journal.db_call(profiles.get, username)
    return profile


def role_tool_policy(request: InvocationRequest, specs: list[ToolSpec]) -> ToolPolicy:
    """The harness plan of this role's snapshot over the employee's tools."""
    harness_settings = (request.harness or {}).get("settings")
    if harness_settings is None:
        # No snapshot means no policy: deny everything rather than guess.
        return ToolPolicy.from_decisions({s.name: ("deny", "no harness snapshot") for s in specs})
    if request.role == LoopRole.LEADER:
        specs = [s for s in specs if s.effect == Effect.READ]
    decisions: dict[str, Any] = plan_tools(harness_settings, specs).decisions()
    # The pattern's autoAllowlist skips the human gate, never a deny.
    for name in request.context.get("auto_allowlist") or []:
        if name in decisions and decision_of(decisions[name]) == "ask":
            decisions[name] = ("allow", "in the pattern's autoAllowlist")
    # Tools a provider requires reviewed (Skill Hub skillLoopConfigs) always ask; the allowlist
    # cannot waive it.
    decisions.update(provider_review_gates(decisions))
    return ToolPolicy.from_decisions(decisions)


class AgentInvoker:
    """The tool loop with each employee's model, prompt, tools and limits."""

    def __init__(self, tools: ToolRegistry | None = None) -> None:
        ledger = DirectoryLedger(settings.VAR_DIR / "tool-ledger")
        # Skill Hub skills (skill_hub_*) come from the registered tool providers.
        self.tools = tools or builtin_registry(FileToolConfig(ledger=ledger)).with_providers(
            tool_providers()
        )
        # bash only where the sandbox runs: absent from the registry (never offered) elsewhere.
        if tools is None and (bash := bash_tool(BashConfig(ledger=ledger))) is not None:
            self.tools.register(bash)
        self.profiles = ProfileCache()

    @classmethod
    def build(cls) -> AgentInvoker:
        return cls()

    async def prepare(
        self, request: InvocationRequest, journal: StepJournal
    ) -> EmployeeProfile | NotFound:
        """The employee's profile (or why there is none), read while the engine begins the
        invocation."""
        try:
            return await _profile_for(self.profiles, request.employee_username, journal)
        except NotFound as exc:
            return exc

    async def invoke(
        self,
        request: InvocationRequest,
        journal: StepJournal,
        prepared: EmployeeProfile | NotFound | None = None,
    ) -> InvocationOutcome:
        profile = prepared if prepared is not None else await self.prepare(request, journal)
        if isinstance(profile, NotFound):
            return InvocationOutcome(
                kind=OutcomeKind.FAILED, code="unknown_employee", reason=profile.detail
            )
        specs = [tool.spec for name in profile.tools if (tool := self.tools.get(name)) is not None]
        policy = role_tool_policy(request, specs)
        loop = ToolLoopInvoker(
            model_clients=lambda _username: profile.client,
            tools=self.tools,
            policy=lambda _request: policy,
            settings=profile.loop_settings,
            system_prompt=lambda req: _system_prompt(profile, req),
            # Carried by every call's ToolContext: skill tools check the employee's access
            # (a ``custom``-scope skill needs its tool bound) from it, not from a row.
            bound_tools=profile.tools,
        )
        if profile.secrets:
            journal = ScrubbingJournal(journal, profile.secrets)
        with network_access((request.harness or {}).get("settings")):
            outcome = await loop.invoke(request, journal)
        return scrub_outcome(outcome, profile.secrets)


def _system_prompt(profile: EmployeeProfile, request: InvocationRequest) -> str:
    base = default_system_prompt(request)
    return f"{profile.system_prompt}\n\n{base}" if profile.system_prompt else base

"""The production :class:`~runtime.invocation.RoleInvoker`: the durable
tool loop, configured per invocation from the AI employee's row and the run's harness snapshot.

The employee wiring (profile, tool registry, harness policy) lives in
:mod:`orchestrator.agents.wiring`, shared with the OpenAI-compatible endpoint. The employee is
read once per invocation (off the event loop); the tool plan comes from the role's compiled
harness snapshot, so a published policy change never affects a running run. The leader only
ever gets read-effect tools: it plans and changes nothing.
"""

from __future__ import annotations

from typing import cast

from loops.live_text import LiveTextClient, StreamingClient
from loops.semantic_cache import semantic_cache_wrap
from orchestrator.agents.quota_journal import QuotaJournal
from orchestrator.agents.subagent_host import agent_tools_register
from orchestrator.agents.wiring import (
    EmployeeProfile,
    ProfileCache,
    employee_specs,
    employee_tool_loop,
    employee_tool_registry,
    role_tool_policy,
)
from orchestrator.errors import NotFound
from runtime.content_safety import guarded
from runtime.invocation import (
    InvocationOutcome,
    InvocationRequest,
    OutcomeKind,
    StepJournal,
)
from runtime.scrub import ScrubbingJournal, redact_patterns, scrub_outcome
from runtime.tools import ToolRegistry
from runtime.tools.bash import network_access
from runtime.tools.subagents import invoke_scoped

__all__ = [
    "AgentInvoker",
    "EmployeeProfile",
    "ProfileCache",
    "role_tool_policy",
]


async def _profile_for(
    profiles: ProfileCache, username: str, journal: StepJournal
) -> EmployeeProfile:
    """Read on the journal's database threads (the run driver's pooled connections)."""
    profile: EmployeeProfile = await journal.db_call(profiles.get, username)
    return profile


class AgentInvoker:
    """The tool loop with each employee's model, prompt, tools and limits."""

    def __init__(self, tools: ToolRegistry | None = None) -> None:
        self.profiles = ProfileCache()
        # With the sub-agent dispatch and todo tools (their children draw from this registry).
        self.tools = tools or agent_tools_register(employee_tool_registry(), self.profiles)

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
        policy = role_tool_policy(request, employee_specs(profile, self.tools))
        route = profile.route(role=request.role.value, pattern=request.context.get("pattern", ""))
        client = route.client
        if profile.loop_settings.stream:
            # The streamed text of each model step is shown live on the run page.
            client = LiveTextClient(cast(StreamingClient, client), request)
        # A read-only role may be answered from the pattern's semantic cache (opt-in).
        client, journal = semantic_cache_wrap(request, client, journal, policy, self.tools)
        # Outermost: every call (a cached answer too) passes the run's content-safety rules.
        client = guarded(client, request.context.get("content_safety"), label=request.invocation)
        loop = employee_tool_loop(
            profile, self.tools, route=route, client=client, policy=lambda _r: policy
        )
        if profile.quota is not None and profile.quota.binds:
            journal = QuotaJournal(journal, profile.quota)
        patterns = redact_patterns((request.harness or {}).get("settings"))
        if profile.secrets or patterns:
            journal = ScrubbingJournal(journal, profile.secrets, patterns)
        with network_access((request.harness or {}).get("settings")):
            # In the invocation's scope: child journals, todo restore, the autonomy level.
            outcome = await invoke_scoped(loop, request, journal)
        return scrub_outcome(outcome, profile.secrets, patterns)

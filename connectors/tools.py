"""MCP servers' tools as agent tools: ``mcp__<server>__<tool>`` (docs/interop.md).

:class:`McpToolProvider` is a :class:`~runtime.tools.registry.ToolProvider` (registered by the
app). It offers the tools each enabled server listed when last read (``McpServer.tools``),
reading the rows in a worker thread and keeping them for ``CACHE_SECONDS``. Annotations give the
effect tier the harness plans with: ``readOnlyHint`` → read, ``destructiveHint`` → high-risk
(external), otherwise write.

A call reads its server's row and header values (environment variables the secret rule allows)
at call time, passes the shared circuit breaker of the server (``mcp-server:<name>``), and opens
one MCP session for it. Every failure is a tool error the model reads, never a failed run. A
call re-issued after a crash (``ToolContext.reissued``) is sent again only when that cannot do
twice what it did once: a read-only or ``idempotentHint`` tool; any other is not re-sent and
the model is told its outcome is unknown. The idempotency key travels in the request's
``_meta`` for servers that honour one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from typing import Any

from connectors.mcp_client import CallAnswer, ServerAccess, call_tool
from connectors.models import McpServer
from connectors.naming import PREFIX, effect_of
from connectors.offered import OfferedTools
from connectors.services import failure_reason, mcp_server_refresh_by_name, server_access
from orchestrator.dbthreads import OffLoopDb
from runtime.breaker import CircuitBreaker, Verdict
from runtime.outbound import OutboundRefused
from runtime.reach import network_refusal
from runtime.tools.base import Tool, ToolContext, ToolResult
from runtime.tools.bash import call_network
from runtime.types import Effect, ToolSpec

CACHE_SECONDS = 2.0
#: How long an open server breaker waits before its next probe.
BREAKER_COOLDOWN_SECONDS = 30.0
#: The idempotency key's ``_meta`` entry on every call.
IDEMPOTENCY_META = "io.loopwright/idempotency-key"
logger = logging.getLogger(__name__)
_THREADS = OffLoopDb("mcp-tools")


@dataclass(frozen=True)
class OfferedTool:
    """One offered tool: its spec, and where it lives."""

    spec: ToolSpec
    server: str
    remote_name: str
    idempotent: bool


def offered_tools(server: McpServer) -> list[OfferedTool]:
    """The tools ``server`` offers: those it listed, narrowed by its ``tools_filter``, whose
    names can be offered."""
    wanted = set(server.tools_filter or [])
    found = []
    for tool in server.tools or []:
        offered = tool.get("offered_as")
        if not offered or (wanted and tool["name"] not in wanted):
            continue
        annotations = tool.get("annotations") or {}
        description = tool.get("description") or f"{tool['name']} on MCP server {server.name}"
        spec = ToolSpec(
            name=offered,
            description=f"[MCP {server.name}] {description}"[:1024],
            parameters=tool.get("input_schema") or {"type": "object"},
            effect=effect_of(annotations),
        )
        idempotent = annotations.get("idempotentHint") is True
        found.append(OfferedTool(spec, server.name, tool["name"], idempotent))
    return found


def _load() -> dict[str, OfferedTool]:
    tools: dict[str, OfferedTool] = {}
    for server in McpServer.objects.filter(enabled=True):
        for offered in offered_tools(server):
            tools[offered.spec.name] = offered
    return tools


class McpToolProvider(OfferedTools[OfferedTool]):
    """The MCP tools of the production registry."""

    def __init__(self, cache_seconds: float = CACHE_SECONDS) -> None:
        super().__init__(_load, _THREADS, cache_seconds)

    def get(self, name: str) -> Tool | None:
        if not name.startswith(PREFIX):
            return None
        offered = self.offered().get(name)
        return None if offered is None else McpTool(offered, self)


MCP_TOOLS = McpToolProvider()


def _access(name: str) -> ServerAccess | str:
    """How to reach enabled server ``name`` now, or why it cannot be reached (on a thread)."""
    server = McpServer.objects.filter(name=name, enabled=True).first()
    if server is None:
        return f"MCP server {name!r} is not registered or is disabled."
    access = server_access(server)
    return f"MCP server {name!r}: {access}" if isinstance(access, str) else access


class McpTool:
    """One MCP server tool, called over a fresh session per call."""

    def __init__(self, offered: OfferedTool, provider: McpToolProvider) -> None:
        self.offered = offered
        self.provider = provider

    @property
    def spec(self) -> ToolSpec:
        return self.offered.spec

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        offered = self.offered
        if context.reissued and offered.spec.effect is not Effect.READ and not offered.idempotent:
            return ToolResult(
                f"Error: the earlier call of {offered.spec.name} was interrupted (the worker "
                "stopped) and its outcome is unknown; it was not sent again, since it may have "
                "taken effect. Check the result some other way before calling it again.",
                is_error=True,
            )
        access = await _THREADS.run(functools.partial(_access, offered.server))
        if isinstance(access, str):
            return ToolResult(f"Error: {access}", is_error=True)
        refusal = network_refusal([access.url], *call_network(context))
        if refusal:
            return ToolResult(
                f"Error: MCP server {offered.server} is out of reach: {refusal}.", is_error=True
            )
        breaker = self.provider.breaker()
        key = f"mcp-server:{offered.server}"
        admission = await breaker.admit(key, probe_lease=access.timeout_seconds + 5)
        if not admission.allowed:
            wait = f"; next try in {admission.retry_in:.0f} s" if admission.retry_in else ""
            return ToolResult(
                f"Error: MCP server {offered.server} is unavailable (its circuit is open{wait}). "
                "Carry on without it or try later.",
                is_error=True,
            )
        timeout = max(0.1, min(access.timeout_seconds, context.remaining()))
        try:
            async with asyncio.timeout(timeout):
                answer: CallAnswer = await call_tool(
                    access,
                    offered.remote_name,
                    arguments,
                    meta={IDEMPOTENCY_META: context.idempotency_key},
                    on_list_changed=lambda: refresh_soon(offered.server),
                )
        except OutboundRefused as exc:
            await breaker.record_success(admission, cooldown=BREAKER_COOLDOWN_SECONDS)
            return ToolResult(f"Error: MCP server {offered.server} refused: {exc}", is_error=True)
        except Exception as exc:  # transport, protocol, timeout: the server failed this call
            await breaker_failed(breaker, admission)
            reason = failure_reason(exc)
            logger.warning("MCP %s: %s failed: %s", offered.server, offered.remote_name, reason)
            return ToolResult(
                f"Error: MCP server {offered.server} failed on {offered.remote_name}: {reason}",
                is_error=True,
            )
        await breaker.record_success(admission, cooldown=BREAKER_COOLDOWN_SECONDS)
        text, images = answer.text or "(no content)", answer.images
        return ToolResult(text, is_error=answer.is_error, images=images)


async def breaker_failed(breaker: CircuitBreaker, admission: Any) -> None:
    """Count a failed call on ``breaker``: a failed probe opens it again at once."""
    if admission.verdict is Verdict.PROBE:
        await breaker.record_failure(admission, cooldown=BREAKER_COOLDOWN_SECONDS)
    else:
        await breaker.count_failure(admission, cooldown=BREAKER_COOLDOWN_SECONDS)


def refresh_soon(server: str) -> None:
    """A server said its tool list changed: list it again in the background."""
    _THREADS.submit(functools.partial(mcp_server_refresh_by_name, server))

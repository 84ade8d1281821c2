"""The builtin ``bash`` tool: a shell command run only through the sandbox.

The command runs under bubblewrap (``sandbox``, see docs/sandbox.md) with the run's
working directory bound read-write at ``/workdir`` (its working directory and ``HOME``) and
nothing else of the host writable or visible besides ``/usr``. The calling invocation's
compiled harness (``ToolContext.invocation.harness``; outside a run, the one
:func:`network_access` set) decides the rest:

- ``isolation.networkAccess``: ``deny`` (also without a harness) no network; ``allow`` the host
  network; ``restricted`` only HTTP(S) to ``isolation.allowedHosts``, through an allowlisting
  proxy started for the command (``runtime.egress_proxy``; refused hosts are listed in the
  result);
- ``paths.deny`` and ``paths.maxFiles``: denied paths are masked inside the sandbox, and what
  the command created or changed against them is undone afterwards (:mod:`.bash_paths`).

The command gets the tool's timeout (less what the loop's own per-call deadline leaves), the
sandbox's rlimits, and its output is cut at the tool's maximum.

Where bubblewrap cannot run, the tool is not offered at all (:func:`bash_tool` returns None):
the rlimit-only escape hatch of the sandbox is never used for model-written commands.

The effect is ``external``: a command can do anything its sandbox allows, so the harness plan
gates it like any high-risk tool unless a profile says otherwise.

A re-issued call (the worker died after the command started) finds the output of a command
that had finished in the effect ledger and returns it instead of running the command again;
one that had not finished runs again, with the same ``LOOPWRIGHT_IDEMPOTENCY_KEY`` in its
environment so a script can make its own effect happen once. The directory a killed worker left
lent to the sandbox uid is given back before it is used again (docs/sandbox.md, "Borrowed work
directories"); the directory may live anywhere, also under a ``0700`` parent.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from runtime.egress_proxy import egress_for, egress_notes
from runtime.tools.base import ToolContext, ToolError, ToolResult
from runtime.tools.bash_paths import Enforcement, TreeScan, enforce, prepare
from runtime.tools.ledger import EffectLedger, LedgerEntry, MemoryLedger, digest
from runtime.tools.workspace import PathRules
from runtime.truncation import truncate_output
from runtime.types import Effect, ToolSpec
from sandbox import (
    Network,
    SandboxBusy,
    SandboxConfig,
    SandboxLimits,
    SandboxRequest,
    SandboxRequestError,
    SandboxResult,
    SandboxUnavailable,
    probe_backend,
    run_sandboxed_async,
)

logger = logging.getLogger(__name__)

BASH_PATH = "/usr/bin/bash"
#: Seconds the sandbox's own kill comes before the loop's per-call deadline, so the command
#: is killed (and its partial output kept) rather than abandoned.
_DEADLINE_MARGIN_SECONDS = 1.0
_MAX_COMMAND_CHARS = 100_000

#: The harness settings of the invocation being run, for calls whose ``ToolContext`` carries
#: no invocation; set around the loop (:func:`network_access`). Unset means denied.
_SETTINGS: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "bash_harness", default=None
)

BASH_SPEC = ToolSpec(
    name="bash",
    description=(
        "Run a bash command in a sandbox whose working directory (and HOME) is the run's "
        "working directory. Only /usr and that directory exist; the network is usually "
        "unavailable. Returns the exit code, stdout and stderr."
    ),
    parameters={
        "type": "object",
        "properties": {
            "command": {
                "type": "string",
                "minLength": 1,
                "maxLength": _MAX_COMMAND_CHARS,
                "description": "The bash script to run (bash -c).",
            },
            "timeout_seconds": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": 3600,
                "description": "Wall-clock limit; the tool's own limit applies when lower.",
            },
        },
        "required": ["command"],
        "additionalProperties": False,
    },
    effect=Effect.EXTERNAL,
    needs_workdir=True,
)


@dataclass(frozen=True)
class BashConfig:
    #: The command's own ceiling; the loop's per-call timeout (the employee's) also applies.
    timeout_seconds: float = 600.0
    #: Characters of output returned to the model (stdout and stderr together).
    max_output_chars: int = 50_000
    #: Bytes read per stream before the command is killed (the sandbox's output cap).
    output_cap_bytes: int = 1024 * 1024
    limits: SandboxLimits = field(default_factory=lambda: SandboxLimits(cpu_seconds=60))
    #: None: ``SandboxConfig.from_env()`` at each call.
    sandbox: SandboxConfig | None = None
    ledger: EffectLedger = field(default_factory=MemoryLedger)

    def sandbox_config(self) -> SandboxConfig:
        return self.sandbox or SandboxConfig.from_env()


@contextlib.contextmanager
def network_access(harness_settings: Mapping[str, Any] | None) -> Iterator[None]:
    """Run the body with the network ``harness_settings`` grant to ``bash`` calls that carry
    no invocation of their own (a call's ``ToolContext.invocation`` takes precedence)."""
    token = _SETTINGS.set(harness_settings)
    try:
        yield
    finally:
        _SETTINGS.reset(token)


def network_of(settings: Mapping[str, Any] | None) -> tuple[Network, tuple[str, ...]]:
    """The sandbox network mode and allowed hosts ``settings`` grant; no settings: deny."""
    isolation = (settings or {}).get("isolation") or {}
    if not isinstance(isolation, Mapping):
        return "deny", ()
    mode = isolation.get("networkAccess")
    hosts = tuple(str(h) for h in isolation.get("allowedHosts") or () if isinstance(h, str))
    if mode == "allow":
        return "allow", ()
    return ("restricted", hosts) if mode == "restricted" else ("deny", ())


def current_network() -> Network:
    return network_of(_SETTINGS.get())[0]


def call_network(context: ToolContext) -> tuple[Network, tuple[str, ...]]:
    """The network mode and allowed hosts the calling role's harness grants a call (MCP and A2A
    tools apply them to their servers as the sandbox does)."""
    return network_of(_settings_of(context))


def _settings_of(context: ToolContext) -> Mapping[str, Any] | None:
    if context.invocation is not None:
        return context.invocation.harness
    return _SETTINGS.get()


def sandbox_unavailable_reason(config: SandboxConfig | None = None) -> str | None:
    """Why ``bash`` cannot be offered here, or None when bubblewrap works (probe cached)."""
    config = config or SandboxConfig.from_env()
    for path in (BASH_PATH, config.python_path):
        if not os.access(path, os.X_OK):
            return f"{path} is not installed"
    probe = probe_backend(config)
    return None if probe.bubblewrap else probe.detail


def bash_tool(config: BashConfig | None = None) -> BashTool | None:
    """The ``bash`` tool, or None where no sandbox can run (the tool is then not registered)."""
    config = config or BashConfig()
    reason = sandbox_unavailable_reason(config.sandbox_config())
    if reason is not None:
        logger.warning("bash tool not available: the sandbox cannot run (%s)", reason)
        return None
    return BashTool(config)


class BashTool:
    spec = BASH_SPEC

    def __init__(self, config: BashConfig | None = None) -> None:
        self.config = config or BashConfig()

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        command = arguments["command"]
        if "\x00" in command:
            raise ToolError("The command contains a NUL character; remove it.")
        workdir = _workdir(context)
        if context.reissued and (done := self._recorded(context, command)) is not None:
            return done
        timeout = self._timeout(arguments, context)
        rules = PathRules.of(context.invocation)
        network, hosts = network_of(_settings_of(context))
        async with _workdir_lock(workdir):
            context.check()
            before = await asyncio.to_thread(prepare, workdir, rules, rules.max_files)
            request = SandboxRequest(
                language="python",
                code=_trampoline(command),
                env={"LOOPWRIGHT_IDEMPOTENCY_KEY": context.idempotency_key},
                timeout_seconds=timeout,
                limits=self.config.limits,
                output_cap_bytes=self.config.output_cap_bytes,
                network=network,
                workdir=workdir,
                mask_dirs=tuple(before.mask_dirs) if before else (),
                mask_files=tuple(before.mask_files) if before else (),
            )
            try:
                result, notes = await self._sandboxed(request, hosts, context)
            except BaseException:
                # Cancelled or refused: the command is dead; undo what the settings forbid.
                if before is not None:
                    _enforce(workdir, before, rules, context)
                raise
            kept = await asyncio.to_thread(_enforce, workdir, before, rules, context)
        content = _render(result, timeout, self.config.max_output_chars)
        lines = [*notes, *(kept.lines if kept else [])]
        if lines:
            content += "\n" + "\n".join(lines)
        killed = result.killed_reason is not None or bool(kept and kept.refused)
        # After the run and before the journal completes the step: a crash in between
        # re-issues the call, which then returns this output instead of running it again.
        self.config.ledger.put(
            context.idempotency_key,
            LedgerEntry(path="", digest=_command_digest(command), message=content),
        )
        written = tuple(kept.written) if kept else ()
        return ToolResult(content, is_error=killed, files_written=written)

    async def _sandboxed(
        self, request: SandboxRequest, hosts: tuple[str, ...], context: ToolContext
    ) -> tuple[SandboxResult, list[str]]:
        config = self.config.sandbox_config()
        try:
            egress = egress_for(request, hosts, config, layer=_hosts_layer(context))
            async with egress as (proxied, proxy):
                result = await run_sandboxed_async(proxied, config)
            return result, egress_notes(proxy)
        except SandboxUnavailable as exc:
            raise ToolError(f"The sandbox cannot run here, so bash is unavailable: {exc}") from exc
        except SandboxRequestError as exc:
            raise ToolError(f"bash cannot use this working directory: {exc}") from exc
        except SandboxBusy as exc:
            raise ToolError(f"Every sandbox is busy; try again later ({exc}).") from exc

    def _recorded(self, context: ToolContext, command: str) -> ToolResult | None:
        entry = self.config.ledger.get(context.idempotency_key)
        if entry is None or entry.digest != _command_digest(command):
            return None
        return ToolResult(f"{entry.message}\n\n(ran before a worker restart; not run again)")

    def _timeout(self, arguments: dict[str, Any], context: ToolContext) -> float:
        wanted = float(arguments.get("timeout_seconds") or self.config.timeout_seconds)
        timeout = min(wanted, self.config.timeout_seconds)
        left = context.remaining() - _DEADLINE_MARGIN_SECONDS
        if left < timeout:
            timeout = left if left > 0 else context.remaining()
        if timeout <= 0:
            raise ToolError("No time is left for this call; run it as a separate step.")
        return timeout


def _hosts_layer(context: ToolContext) -> str:
    provenance = (context.invocation.harness_provenance if context.invocation else None) or {}
    layer = provenance.get("isolation.allowedHosts")
    return f" (set by {layer})" if layer else ""


def _enforce(
    workdir: str, before: TreeScan | None, rules: PathRules, context: ToolContext
) -> Enforcement | None:
    if before is None:
        return None
    kept = enforce(workdir, before, rules, rules.max_files, set(context.files_written))
    context.files_written.update(kept.written)
    return kept


def _workdir(context: ToolContext) -> str:
    if not context.workdir:
        raise ToolError("This run has no working directory, so bash cannot run.")
    path = os.path.realpath(context.workdir)
    if not os.path.isdir(path):
        raise ToolError(f"The working directory {context.workdir!r} does not exist.")
    return path


def _trampoline(command: str) -> str:
    """The sandbox runs programs; this one becomes bash (``repr`` makes a safe literal)."""
    return (
        "import os\n"
        f"os.execv({BASH_PATH!r}, ['bash', '--noprofile', '--norc', '-c', {command!r}])\n"
    )


def _command_digest(command: str) -> str:
    return digest(command.encode("utf-8", errors="surrogatepass"))


def _render(result: SandboxResult, timeout: float, max_chars: int) -> str:
    head = f"exit code: {result.exit_code}"
    if result.timed_out:
        head += f" (killed: timed out after {timeout:g} s)"
    elif result.killed_reason == "output_cap":
        head += " (killed: too much output)"
    elif result.killed_reason is not None:
        head += f" (killed: {result.killed_reason} limit)"
    parts = [head]
    if result.stdout:
        parts.append(f"stdout:\n{result.stdout}")
    if result.stderr:
        parts.append(f"stderr:\n{result.stderr}")
    return truncate_output("\n".join(parts), max_chars).text


#: One command at a time per working directory and event loop: the sandbox hands the
#: directory to the run's uid for the command's duration.
_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def _workdir_lock(workdir: str) -> asyncio.Lock:
    locks = _LOCKS.setdefault(asyncio.get_running_loop(), {})
    return locks.setdefault(workdir, asyncio.Lock())

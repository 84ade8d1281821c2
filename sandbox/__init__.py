"""The sandbox that Skill Hub skills (and the agent's ``bash`` tool) run in.

Pure Python, no Django. ``run_sandboxed(SandboxRequest(...))`` runs one Python, Node.js or Deno
program under bubblewrap (namespaces, read-only system binds, one writable directory, a seccomp
deny-list) with rlimits, a wall-clock timeout that kills the whole process tree, and streamed
output caps. See docs/sandbox.md for the threat model and what is and is not contained.
"""

from __future__ import annotations

from sandbox.config import SandboxConfig
from sandbox.probe import BackendProbe, probe_backend
from sandbox.runner import (
    OutputMeter,
    run_sandboxed,
    run_sandboxed_async,
    sandbox_reap_stale,
)
from sandbox.types import (
    Backend,
    KilledReason,
    Language,
    MiB,
    Network,
    OutputFile,
    SandboxBusy,
    SandboxError,
    SandboxLimits,
    SandboxRequest,
    SandboxRequestError,
    SandboxResult,
    SandboxUnavailable,
)
from sandbox.workdir import workdir_lent, workdir_reclaim

__all__ = [
    "Backend",
    "BackendProbe",
    "KilledReason",
    "Language",
    "MiB",
    "Network",
    "OutputFile",
    "OutputMeter",
    "SandboxBusy",
    "SandboxConfig",
    "SandboxError",
    "SandboxLimits",
    "SandboxRequest",
    "SandboxRequestError",
    "SandboxResult",
    "SandboxUnavailable",
    "probe_backend",
    "run_sandboxed",
    "run_sandboxed_async",
    "sandbox_reap_stale",
    "workdir_lent",
    "workdir_reclaim",
]

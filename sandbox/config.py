"""Operator settings of the sandbox, read from the environment at call time.

The module is Django-free, so it does not read ``orchestrator.settings``; the same variables are
documented in docs/sandbox.md and the README.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

_TRUE = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True)
class SandboxConfig:
    bwrap_path: str = "/usr/bin/bwrap"
    python_path: str = "/usr/bin/python3"
    node_path: str = "/usr/bin/node"
    #: Where scripts/install-system-deps.sh puts the pinned Deno (deploy/deno/). A path outside
    #: /usr is bound read-only at the same path into Deno runs only.
    deno_path: str = "/opt/loopwright/deno/bin/deno"
    #: Run programs with rlimits only when bubblewrap cannot run (weaker: see docs/sandbox.md).
    allow_rlimit_only: bool = False
    #: Where per-run directories are created ("" = the system temporary directory). Every
    #: component must be traversable by the sandbox uid, as bubblewrap runs with that uid
    #: (a borrowed work directory need not be: it is reached through its run directory).
    work_root: str = ""
    #: When the runner is root, each concurrent run gets its own host uid
    #: ``uid_base + slot`` (slot < uid_slots): RLIMIT_NPROC is not enforced for root, and a
    #: dedicated uid makes "every process of this run" a precise, killable set.
    uid_base: int = 1_500_000_000
    uid_slots: int = 64
    #: Lock files of the uid slots (root only), shared by every worker process on the host.
    slot_dir: str = "/run/loopwright-sandbox"
    #: Sandboxed programs run at this niceness so a fork bomb cannot starve the control plane.
    niceness: int = 10
    #: Host directories bound read-only at the same path, for interpreters outside /usr.
    extra_ro_binds: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SandboxConfig:
        env = os.environ if environ is None else environ
        default = cls()
        binds = tuple(p for p in env.get("LOOPWRIGHT_SANDBOX_EXTRA_RO_BINDS", "").split(":") if p)
        return cls(
            bwrap_path=env.get("LOOPWRIGHT_SANDBOX_BWRAP", default.bwrap_path),
            python_path=env.get("LOOPWRIGHT_SANDBOX_PYTHON", default.python_path),
            node_path=env.get("LOOPWRIGHT_SANDBOX_NODE", default.node_path),
            deno_path=env.get("LOOPWRIGHT_SANDBOX_DENO", default.deno_path),
            allow_rlimit_only=_flag(env.get("LOOPWRIGHT_SANDBOX_ALLOW_RLIMIT_ONLY", "")),
            work_root=env.get("LOOPWRIGHT_SANDBOX_WORK_ROOT", default.work_root),
            uid_base=int(env.get("LOOPWRIGHT_SANDBOX_UID_BASE", default.uid_base)),
            uid_slots=int(env.get("LOOPWRIGHT_SANDBOX_UID_SLOTS", default.uid_slots)),
            slot_dir=env.get("LOOPWRIGHT_SANDBOX_SLOT_DIR", default.slot_dir),
            niceness=int(env.get("LOOPWRIGHT_SANDBOX_NICENESS", default.niceness)),
            extra_ro_binds=binds,
        )

    def resolved_work_root(self) -> str:
        return self.work_root or tempfile.gettempdir()

    def sandbox_uids(self) -> range:
        """Every host uid a sandbox may run as: the slots and the probe's uid after them."""
        return range(self.uid_base, self.uid_base + self.uid_slots + 1)

    def interpreter(self, language: str) -> str:
        if language == "deno":
            return self.deno_path
        return self.python_path if language == "python" else self.node_path


def _flag(value: str) -> bool:
    return value.strip().lower() in _TRUE

"""Can bubblewrap run here? Probed once per configuration, by running the real chain.

The probe starts exactly the command line a run would use (same uid switch, same mounts, same
seccomp filter) with ``/usr/bin/true`` as the program. Anything that would break a real run
(no unprivileged user namespaces, an AppArmor rule against them, a missing mount source, no
``/usr/bin/choom``) breaks the probe the same way, and its stderr becomes the error message.

A root runner also probes the chain of a borrowed work directory in a private mount namespace
(``private_bind``), on a directory whose parent the sandbox uid cannot search. Where the kernel
refuses that namespace (a container without CAP_SYS_ADMIN), borrowed directories are bound
directly, and their parents must then be searchable by others.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass

from sandbox import seccomp
from sandbox.command import bwrap_launch
from sandbox.config import SandboxConfig
from sandbox.launchfds import launch_fds
from sandbox.procs import probe_uid
from sandbox.types import SandboxRequest
from sandbox.workdir import RunDir, rundir_create, rundir_remove

_PROBE_TIMEOUT_SECONDS = 20


@dataclass(frozen=True)
class BackendProbe:
    bubblewrap: bool
    #: Why bubblewrap is unavailable, or its version.
    detail: str
    #: The seccomp filter could be compiled (libseccomp present); None: why not.
    seccomp_error: str | None
    #: Runs get a dedicated host uid (the runner is root).
    dedicated_uid: bool
    #: A borrowed work directory is bound in a private mount namespace before the uid drop
    #: (root runner), so its parents need not be searchable by the sandbox uid.
    private_bind: bool = False


_cache: dict[SandboxConfig, BackendProbe] = {}
_lock = threading.Lock()


def probe_backend(config: SandboxConfig, *, refresh: bool = False) -> BackendProbe:
    """The cached probe result for this configuration (``refresh`` runs it again)."""
    with _lock:
        if refresh or config not in _cache:
            _cache[config] = _probe(config)
        return _cache[config]


def _probe(config: SandboxConfig) -> BackendProbe:
    seccomp_error = _seccomp_error()
    dedicated = os.geteuid() == 0
    if not os.access(config.bwrap_path, os.X_OK):
        return BackendProbe(
            False, f"{config.bwrap_path} is not installed", seccomp_error, dedicated
        )
    uid = probe_uid(config) if dedicated else None
    request = SandboxRequest(language="python", code="")
    rundir = rundir_create(
        work_root=config.resolved_work_root(),
        request=request,
        owner=(uid, uid) if uid is not None else None,
    )
    try:
        ok, detail = _run_true(config, rundir, uid, seccomp_error is None)
    finally:
        rundir_remove(rundir)
    private = ok and uid is not None and _private_bind_works(config, uid, seccomp_error is None)
    return BackendProbe(ok, detail, seccomp_error, dedicated, private)


def _private_bind_works(config: SandboxConfig, uid: int, with_seccomp: bool) -> bool:
    """Can a borrowed directory be bound in a private mount namespace? Tried on one whose
    parent (mode 0700, the runner's) the probe uid cannot search."""
    hidden = tempfile.mkdtemp(prefix="loopwright-probe-", dir=config.resolved_work_root())
    try:
        borrowed = os.path.join(hidden, "work")
        os.mkdir(borrowed, 0o700)
        request = SandboxRequest(language="python", code="", workdir=borrowed)
        rundir = rundir_create(
            work_root=config.resolved_work_root(),
            request=request,
            owner=(uid, uid),
            bind_privately=True,
            sandbox_uids=config.sandbox_uids(),
        )
        try:
            ok, _ = _run_true(config, rundir, uid, with_seccomp, request)
        finally:
            rundir_remove(rundir)
        return ok
    finally:
        shutil.rmtree(hidden, ignore_errors=True)


def _seccomp_error() -> str | None:
    try:
        seccomp.deny_filter_bpf()
    except seccomp.SeccompUnavailable as exc:
        return str(exc)
    return None


def _run_true(
    config: SandboxConfig,
    rundir: RunDir,
    uid: int | None,
    with_seccomp: bool,
    request: SandboxRequest | None = None,
) -> tuple[bool, str]:
    request = request or SandboxRequest(language="python", code="")
    with launch_fds(with_seccomp) as fds:
        launch = bwrap_launch(
            config=config,
            request=request,
            rundir=rundir,
            uid=uid,
            seccomp_fd=fds.seccomp,
            args_fd=fds.args,
            status_fd=fds.status_write,
            program=["/usr/bin/true"],
        )
        fds.fill_args(launch)
        try:
            done = subprocess.run(
                launch.argv,
                env=launch.env,
                cwd=launch.cwd,
                capture_output=True,
                timeout=_PROBE_TIMEOUT_SECONDS,
                pass_fds=fds.passed(),
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"bubblewrap probe failed to run: {exc}"
    if done.returncode != 0:
        stderr = done.stderr.decode(errors="replace").strip()
        return False, f"bubblewrap probe exited {done.returncode}: {stderr}"
    return True, _bwrap_version(config)


def _bwrap_version(config: SandboxConfig) -> str:
    try:
        out = subprocess.run(
            [config.bwrap_path, "--version"], capture_output=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return "bubblewrap (version unknown)"
    return out.stdout.decode(errors="replace").strip() or "bubblewrap"

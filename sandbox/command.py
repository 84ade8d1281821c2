"""The command lines of a sandboxed run (pure: no process is started here).

A run is a chain of small exec-ing programs, each adding one property, so that no Python code
runs between ``fork`` and ``exec`` (``preexec_fn`` is unsafe in threaded and asyncio programs):

    choom -n 1000        the kernel's OOM killer takes sandbox processes first; written while
                         still root, which also stops the program from lowering it again
    unshare --mount      (root, borrowed work dir) a private mount namespace in which, still as
    sh -c 'mount --bind' root, the borrowed directory is bound onto the run directory's
                         ``work/``: the sandbox uid reaches it there, whatever its parents allow
    setpriv --reuid U    (root only) a dedicated unprivileged host uid: RLIMIT_NPROC is never
                         enforced for root, and a per-run uid makes the run's processes a set
                         the runner can find and kill
    nice -n N            a fork bomb competes for CPU at low weight against the control plane
    bwrap ...            namespaces, read-only system binds, one writable dir, seccomp
    prlimit ...          rlimits set *inside* the new user namespace: RLIMIT_NPROC then counts
                         only this sandbox's tasks, not every process of the host uid
    python3 -I -S ...    / node --max-old-space-size=... / deno run --allow-...=... (denoargs.py)

The rlimit-only backend is the same chain without ``bwrap``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sandbox.config import SandboxConfig
from sandbox.denoargs import deno_argv, deno_env, deno_net_flags
from sandbox.egress import FORWARDER_NAME, SANDBOX_EGRESS_SOCKET, proxy_env
from sandbox.nodestdio import node_stdio_args
from sandbox.types import (
    NODE_RESERVED_ADDRESS_SPACE,
    Language,
    MiB,
    SandboxLimits,
    SandboxRequest,
)
from sandbox.workdir import CODE_NAMES, SANDBOX_USER, RunDir

CHOOM = "/usr/bin/choom"
SETPRIV = "/usr/bin/setpriv"
NICE = "/usr/bin/nice"
PRLIMIT = "/usr/bin/prlimit"
UNSHARE = "/usr/bin/unshare"
SH = "/bin/sh"
#: Run as root in the new private mount namespace: bind "$1" onto "$2", then exec the rest of
#: the chain. The paths are arguments, never part of the script text; 125 marks its failure.
BIND_SCRIPT = '/usr/bin/mount --bind -- "$1" "$2" || exit 125; shift 2; exec "$@"'

SANDBOX_WORKDIR = "/workdir"
SANDBOX_CODE_DIR = "/code"
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
#: Where a Python skill's package environment is bound read-only (its ``site-packages`` goes
#: on ``sys.path``), and where a Node.js skill's ``node_modules`` is: ``require`` and
#: ``import`` from /code or /workdir look in /node_modules after their own directories.
SANDBOX_ENV_DIR = "/skill-env"
SANDBOX_NODE_MODULES = "/node_modules"
#: ``python3 -I -S -c BOOT SITE PROGRAM``: appends SITE to ``sys.path`` (after the standard
#: library, so a package cannot shadow it) and runs PROGRAM as ``__main__``. The isolation
#: flags are untouched: no PYTHON* variables, no user or system site-packages, no script dir.
PYTHON_ENV_BOOT = (
    "import sys, runpy\n"
    "sys.path.append(sys.argv[1])\n"
    "sys.argv[:] = sys.argv[2:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)
#: Private tmpfs mounts inside the sandbox's own mount namespace, not the host's directories.
SANDBOX_TMP = "/tmp"  # noqa: S108
SANDBOX_SHM = "/dev/shm"  # noqa: S108

#: Host root entries that are symlinks into /usr on merged-/usr systems (Debian 12), or
#: directories on older layouts; bound read-only either way.
_ROOT_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
#: The only pieces of the host's /etc a program sees: the loader cache, public CA certificates
#: and the service/protocol tables. Never passwd/shadow, ssl/private or anything with secrets.
_ETC_ALWAYS = (
    "/etc/ld.so.cache",
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
    "/etc/services",
    "/etc/protocols",
)
#: Name resolution, only when the network is shared.
_ETC_NETWORK = (
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
)


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    #: The environment of the first program in the chain. For bubblewrap it is empty: the
    #: program's own environment is set with ``--setenv`` after ``--clearenv``.
    env: dict[str, str]
    cwd: str
    #: bubblewrap's options, NUL-separated, for the ``--args FD`` descriptor. They hold the
    #: program's environment values and host paths, which must not sit in an argv: any host
    #: user can read a process's command line, and so can the sandbox (it is bwrap's PID 1).
    bwrap_options: bytes = b""


def options_blob(options: list[str]) -> bytes:
    return b"".join(option.encode() + b"\0" for option in options)


def program_env(request: SandboxRequest, *, home: str, tmpdir: str) -> dict[str, str]:
    env = {
        "PATH": SANDBOX_PATH,
        "HOME": home,
        "TMPDIR": tmpdir,
        "LANG": "C.UTF-8",
        "TZ": "UTC",
        "USER": "sandbox",
    }
    env.update(request.env)
    return env


def interpreter_argv(
    config: SandboxConfig,
    language: Language,
    code_path: str,
    address_space: int,
    site_packages: str | None = None,
) -> list[str]:
    if language == "python":
        # -I: ignore PYTHON* variables and the user site; -S: no site-packages, so the host's
        # installed packages are not importable by accident (skills declare their packages);
        # -B: no .pyc writes; utf8 mode: the same stdout encoding whatever the locale.
        python = [config.python_path, "-I", "-S", "-B", "-X", "utf8"]
        if site_packages is not None:
            return [*python, "-c", PYTHON_ENV_BOOT, site_packages, code_path]
        return [*python, code_path]
    heap_mib = max(64, (address_space - NODE_RESERVED_ADDRESS_SPACE) // MiB)
    # Blocking stdout/stderr, so an output flood meets the cap (nodestdio.py).
    stdio = node_stdio_args(config.node_path)
    return [config.node_path, f"--max-old-space-size={heap_mib}", *stdio, code_path]


def deno_program(
    config: SandboxConfig,
    request: SandboxRequest,
    code_path: str,
    *,
    work: str,
    tmp: str,
    address_space: int,
) -> list[str]:
    """``deno run`` for this request: Deno's permissions (denoargs.py) over these paths."""
    net = deno_net_flags(request.network, egress_enabled(request), request.egress_hosts)
    return deno_argv(
        config.deno_path,
        code_path,
        readable=(work, tmp),
        writable=(work, tmp),
        net=net,
        address_space=address_space,
    )


def limits_argv(limits: SandboxLimits, address_space: int) -> list[str]:
    cpu = limits.cpu_seconds
    return [
        PRLIMIT,
        # soft < hard: SIGXCPU at the soft limit tells "cpu" apart from other SIGKILLs; a
        # program that ignores SIGXCPU gets SIGKILL one second later.
        f"--cpu={cpu}:{cpu + 1}",
        f"--as={address_space}:{address_space}",
        f"--nproc={limits.max_processes}:{limits.max_processes}",
        f"--nofile={limits.open_files}:{limits.open_files}",
        f"--fsize={limits.file_size_bytes}:{limits.file_size_bytes}",
        # No core files: they would land in the work dir, or go to a host core handler.
        "--core=0:0",
        "--",
    ]


def host_prefix(
    config: SandboxConfig, uid: int | None, private_bind: tuple[Path, Path] | None = None
) -> list[str]:
    """The chain before bwrap. ``private_bind`` (source, mount point): bind the source there in
    a private mount namespace, as root, before the uid drop (the namespace, and the mount with
    it, ends with the run's last process; nothing is mounted in the host's namespace)."""
    argv = [CHOOM, "-n", "1000", "--"]
    if private_bind is not None:
        source, point = private_bind
        argv += [UNSHARE, "--mount", "--propagation", "private", "--"]
        argv += [SH, "-c", BIND_SCRIPT, "sh", str(source), str(point)]
    if uid is not None:
        argv += [
            SETPRIV,
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--no-new-privs",
            "--",
        ]
    return [*argv, NICE, "-n", str(config.niceness), "--"]


def bwrap_launch(
    *,
    config: SandboxConfig,
    request: SandboxRequest,
    rundir: RunDir,
    uid: int | None,
    seccomp_fd: int | None,
    args_fd: int,
    status_fd: int,
    program: list[str] | None = None,
) -> Launch:
    """The bubblewrap chain; ``program`` replaces the interpreter (the probe runs ``true``)."""
    address_space = request.limits.address_space_for(request.language)
    code_path = f"{SANDBOX_CODE_DIR}/{CODE_NAMES[request.language]}"
    env = program_env(request, home=SANDBOX_WORKDIR, tmpdir=SANDBOX_TMP)
    if program is None and request.language == "deno":
        program = deno_program(
            config,
            request,
            code_path,
            work=SANDBOX_WORKDIR,
            tmp=SANDBOX_TMP,
            address_space=address_space,
        )
        env.update(deno_env(SANDBOX_TMP))
    if program is None:
        site = f"{SANDBOX_ENV_DIR}/site-packages" if request.packages_dir else None
        program = interpreter_argv(config, request.language, code_path, address_space, site)
    egress = egress_enabled(request)
    if egress:
        forwarder = f"{SANDBOX_CODE_DIR}/{FORWARDER_NAME}"
        program = [config.python_path, "-I", "-S", "-B", forwarder, *program]
        env.update(proxy_env())
    inner = limits_argv(request.limits, address_space) + program
    options = bwrap_options(
        config=config,
        rundir=rundir,
        code_path=code_path,
        share_net=request.network == "allow",
        tmpfs_bytes=request.limits.tmpfs_bytes,
        env=env,
        seccomp_fd=seccomp_fd,
        extra_mounts=mask_options(request)
        + egress_options(request, rundir)
        + interpreter_binds(config, request)
        + packages_options(request),
    )
    options += ["--json-status-fd", str(status_fd)]
    private = None if rundir.bind_point is None else (rundir.work, rundir.bind_point)
    prefix = host_prefix(config, uid, private)
    argv = [*prefix, config.bwrap_path, "--args", str(args_fd), "--", *inner]
    return Launch(argv=argv, env={}, cwd="/", bwrap_options=options_blob(options))


def egress_enabled(request: SandboxRequest) -> bool:
    """Whether the program runs behind the egress forwarder (``restricted`` with a proxy)."""
    return request.network == "restricted" and request.egress_socket is not None


def mask_options(request: SandboxRequest) -> list[str]:
    """Hide the denied paths of a borrowed work dir (the harness's ``paths.deny``): an empty
    tmpfs over a directory (what the program writes there vanishes with the sandbox) and
    ``/dev/null`` read-only over a file (reads are empty, writes fail)."""
    options: list[str] = []
    for relative in request.mask_dirs:
        options += ["--tmpfs", f"{SANDBOX_WORKDIR}/{relative}"]
    for relative in request.mask_files:
        options += ["--ro-bind", "/dev/null", f"{SANDBOX_WORKDIR}/{relative}"]
    return options


def interpreter_binds(config: SandboxConfig, request: SandboxRequest) -> list[str]:
    """Deno installed outside /usr (/opt/loopwright/deno): its binary, read-only at the same
    path, in Deno runs only."""
    path = config.deno_path
    if request.language != "deno" or path.startswith("/usr/"):
        return []
    return ["--ro-bind", path, path]


def packages_options(request: SandboxRequest) -> list[str]:
    """The skill's package environment, read-only: a program cannot change what later runs of
    the skill (or of other skills with the same packages) import."""
    if request.packages_dir is None:
        return []
    if request.language == "node":
        return ["--ro-bind", f"{request.packages_dir}/node_modules", SANDBOX_NODE_MODULES]
    return ["--ro-bind", request.packages_dir, SANDBOX_ENV_DIR]


def egress_options(request: SandboxRequest, rundir: RunDir) -> list[str]:
    if not egress_enabled(request):
        return []
    return [
        "--bind",
        str(request.egress_socket),
        SANDBOX_EGRESS_SOCKET,
        "--ro-bind",
        str(rundir.root / FORWARDER_NAME),
        f"{SANDBOX_CODE_DIR}/{FORWARDER_NAME}",
    ]


def rlimit_launch(
    *, config: SandboxConfig, request: SandboxRequest, rundir: RunDir, uid: int | None
) -> Launch:
    address_space = request.limits.address_space_for(request.language)
    env = program_env(request, home=str(rundir.work), tmpdir=str(rundir.tmp))
    # No mount namespace here: the environment is used at its host path (owned by the service
    # user, so the run's uid cannot write it either).
    packages = request.packages_dir
    if request.language == "deno":
        work, tmp = str(rundir.work), str(rundir.tmp)
        program = deno_program(
            config, request, str(rundir.code), work=work, tmp=tmp, address_space=address_space
        )
        env.update(deno_env(tmp))
    else:
        site = f"{packages}/site-packages" if packages and request.language == "python" else None
        program = interpreter_argv(config, request.language, str(rundir.code), address_space, site)
    if packages and request.language == "node":
        env["NODE_PATH"] = f"{packages}/node_modules"
    argv = host_prefix(config, uid) + limits_argv(request.limits, address_space) + program
    return Launch(argv=argv, env=env, cwd=str(rundir.work))


def bwrap_options(
    *,
    config: SandboxConfig,
    rundir: RunDir,
    code_path: str,
    share_net: bool,
    tmpfs_bytes: int,
    env: Mapping[str, str],
    seccomp_fd: int | None,
    extra_mounts: list[str] | None = None,
) -> list[str]:
    """bubblewrap's options (everything between the program name and ``--``)."""
    argv = _namespace_args(share_net)
    argv += _system_binds(config, share_net)
    argv += ["--ro-bind", str(rundir.passwd), "/etc/passwd"]
    argv += ["--ro-bind", str(rundir.group), "/etc/group"]
    argv += _scratch_mounts(tmpfs_bytes)
    argv += ["--bind", str(rundir.bind_point or rundir.work), SANDBOX_WORKDIR]
    argv += ["--ro-bind", str(rundir.code), code_path]
    # After the work dir's bind (masks sit on top of it), before / becomes read-only.
    argv += extra_mounts or []
    argv += ["--chdir", SANDBOX_WORKDIR, "--remount-ro", "/"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return argv


def _namespace_args(share_net: bool) -> list[str]:
    args = [
        # --unshare-user (not the -try variant): without a user namespace there is no uid
        # mapping and no --disable-userns, so failing loudly is the right outcome.
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--uid",
        str(SANDBOX_USER),
        "--gid",
        str(SANDBOX_USER),
        "--hostname",
        "sandbox",
        "--die-with-parent",
        # setsid(): no controlling terminal, so TIOCSTI cannot push keystrokes to a host shell.
        "--new-session",
        "--clearenv",
    ]
    return [*args, "--share-net"] if share_net else args


def _system_binds(config: SandboxConfig, share_net: bool) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _ROOT_LINKS:
        host = f"/{name}"
        if os.path.islink(host):
            args += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            args += ["--ro-bind", host, host]
    etc = _ETC_ALWAYS + (_ETC_NETWORK if share_net else ())
    for path in etc:
        args += ["--ro-bind-try", path, path]
    for path in config.extra_ro_binds:
        args += ["--ro-bind", path, path]
    return args


def _scratch_mounts(tmpfs_bytes: int) -> list[str]:
    size = str(tmpfs_bytes)
    return [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        # /dev is a tmpfs the sandbox user owns: give /dev/shm its own bounded tmpfs and make
        # the rest of /dev read-only, or it is an unbounded store of host memory.
        "--size",
        size,
        "--tmpfs",
        SANDBOX_SHM,
        "--remount-ro",
        "/dev",
        "--size",
        size,
        "--tmpfs",
        SANDBOX_TMP,
    ]

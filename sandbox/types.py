"""What a caller hands the sandbox and what it gets back.

Plain frozen dataclasses with their own validation: the module has no Django dependency and the
request is built by trusted code (the skill runtime), so a bad value is a programming error that
must fail loudly before anything is spawned.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Literal

Language = Literal["python", "node", "deno"]
LANGUAGES: tuple[Language, ...] = ("python", "node", "deno")
Network = Literal["deny", "allow", "restricted"]
Backend = Literal["bubblewrap", "rlimit-only"]
KilledReason = Literal["timeout", "output_cap", "cpu", "memory", "file_size"]

MiB = 1024 * 1024
GiB = 1024 * MiB

#: Measured with Node 20: it does not start under RLIMIT_AS = 700 MiB and does under 768 MiB.
NODE_RESERVED_ADDRESS_SPACE = 768 * MiB
#: Measured with Deno 2.9: Oilpan (V8's C++ heap) reserves a 32 GiB cage at start, aligned to
#: its size: when mmap does not honour V8's aligned hint, it reserves twice that and trims. So
#: Deno dies ("CagedHeap reservation") under RLIMIT_AS = 32 GiB, fails ~1 start in 13 under
#: 33.5 to 48 GiB, and starts every time from 64 GiB. Reserved, never touched: RLIMIT_AS cannot
#: bound a Deno program's memory (the watchdog's ``memory_bytes`` and the V8 heap limit do).
DENO_RESERVED_ADDRESS_SPACE = 65 * GiB
#: Default address-space limit per language. V8 reserves address space before it runs a line
#: (its code range and cages; Deno's Oilpan cage too), so Node and Deno need larger limits than
#: CPython; each leaves room for a heap above its reservation.
DEFAULT_ADDRESS_SPACE: Mapping[Language, int] = {
    "python": 512 * MiB,
    "node": 1 * GiB,
    "deno": DENO_RESERVED_ADDRESS_SPACE + 512 * MiB,
}
#: The least address space a V8 program is started with: its reservation plus a 64 MiB heap.
MIN_ADDRESS_SPACE: Mapping[Language, int] = {
    "node": NODE_RESERVED_ADDRESS_SPACE + 64 * MiB,
    "deno": DENO_RESERVED_ADDRESS_SPACE + 64 * MiB,
}

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Names that would change how the interpreter or the dynamic loader starts, which the runner
#: controls itself (heap size, no preloaded libraries, isolated mode).
RESERVED_ENV: frozenset[str] = frozenset(
    {
        "NODE_OPTIONS",
        "LD_PRELOAD",
        "LD_AUDIT",
        "LD_LIBRARY_PATH",
        "PYTHONSTARTUP",
        "PYTHONPATH",
        # Deno reads these beside its flags (the V8 heap, its cache, prompts, permission
        # audits, certificates): the runner sets or withholds them itself.
        "DENO_DIR",
        "DENO_V8_FLAGS",
        "DENO_NO_PROMPT",
        "DENO_NO_UPDATE_CHECK",
        "DENO_NO_PACKAGE_JSON",
        "DENO_AUDIT_PERMISSIONS",
        "DENO_TRACE_PERMISSIONS",
        "DENO_CERT",
        "DENO_TLS_CA_STORE",
        "DENO_AUTH_TOKENS",
        "DENO_CONDITIONS",
        "DENO_COVERAGE_DIR",
        "DENO_UNSTABLE_FLAGS",
    }
)


_LIMIT_FIELDS = (
    "cpu_seconds",
    "max_processes",
    "open_files",
    "file_size_bytes",
    "tmpfs_bytes",
    "memory_bytes",
)


class SandboxError(Exception):
    """Base class of the sandbox's own errors (never raised for a failing program)."""


class SandboxUnavailable(SandboxError):
    """bubblewrap cannot run here and the operator has not allowed the rlimit-only mode."""


class SandboxBusy(SandboxError):
    """Every sandbox uid slot stayed taken until the request's deadline."""


class SandboxRequestError(SandboxError, ValueError):
    """The request itself is invalid (bad path, bad env name, non-positive limit)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Kernel resource limits applied to every process in the sandbox.

    ``max_processes`` counts tasks (threads too) of the sandbox user inside its own user
    namespace, including bubblewrap's init process. ``memory_bytes`` is the resident memory of
    the whole sandbox, enforced by a parent-side watchdog where the runner owns a dedicated uid
    (see docs/sandbox.md); the other limits are per process rlimits.
    """

    cpu_seconds: int = 10
    #: None: the language default from ``DEFAULT_ADDRESS_SPACE``.
    address_space_bytes: int | None = None
    max_processes: int = 32
    open_files: int = 256
    file_size_bytes: int = 64 * MiB
    #: Size of each private tmpfs (``/tmp`` and ``/dev/shm``): tmpfs pages are host memory that
    #: no per-process limit counts, so they need their own cap.
    tmpfs_bytes: int = 64 * MiB
    memory_bytes: int = 1 * GiB

    def __post_init__(self) -> None:
        for name in _LIMIT_FIELDS:
            _require_positive(name, getattr(self, name))
        if self.address_space_bytes is not None:
            _require_positive("address_space_bytes", self.address_space_bytes)

    def address_space_for(self, language: Language) -> int:
        return self.address_space_bytes or DEFAULT_ADDRESS_SPACE[language]


@dataclass(frozen=True)
class SandboxRequest:
    """One program to run: its text, its inputs and the fences around it."""

    language: Language
    #: The program text, already rendered (placeholders replaced by literals).
    code: str
    stdin: str | None = None
    #: Relative path inside the working directory -> content, written before the run.
    files: Mapping[str, bytes] = field(default_factory=dict)
    #: The whole environment of the program besides PATH/HOME/TMPDIR/LANG/TZ: nothing is
    #: inherited from the parent, whose environment holds secrets.
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_seconds: float = 30.0
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    #: Per stream; the program is killed when either stream passes it.
    output_cap_bytes: int = 1 * MiB
    #: "deny": no network namespace shared; "allow": the host network; "restricted": only
    #: HTTP(S) through the host's allowlisting proxy at ``egress_socket`` (without a socket,
    #: "restricted" is run as "deny" with a note).
    network: Network = "deny"
    #: Host path of the Unix socket of an allowlisting HTTP(S) proxy (runtime.egress_proxy);
    #: bound into the sandbox and reached through an in-sandbox forwarder on 127.0.0.1.
    egress_socket: str | None = None
    #: The egress proxy's allowlist (set with ``egress_socket``), for Deno's own ``--allow-net``
    #: (sandbox/denoargs.py): Deno checks a request against its destination, so without them
    #: the proxy could not be used. A second wall only: the proxy decides.
    egress_hosts: tuple[str, ...] = ()
    #: fnmatch pattern over paths relative to ``out/`` in the working directory ("*" matches
    #: "/" too); None collects nothing.
    collect_outputs: str | None = None
    output_file_cap_bytes: int = 10 * MiB
    output_total_cap_bytes: int = 50 * MiB
    output_max_files: int = 100
    #: Operator opt-in to the weaker rlimit-only mode when bubblewrap cannot run.
    allow_rlimit_only: bool = False
    #: An existing host directory (absolute) to use as the working directory instead of a
    #: fresh one: bound read-write at /workdir, handed to the run's uid for the run and back
    #: to its owner afterwards (the agent's ``bash`` tool). No input files, nothing collected.
    workdir: str | None = None
    #: ``workdir``-relative directories hidden behind an empty tmpfs (writes discarded) and
    #: files hidden behind ``/dev/null`` (read-only): the harness's ``paths.deny``.
    mask_dirs: tuple[str, ...] = ()
    mask_files: tuple[str, ...] = ()
    #: A built package environment (absolute host directory: ``site-packages/`` for Python,
    #: ``node_modules/`` for Node.js), bound read-only and put on the interpreter's search
    #: path (docs/sandbox.md, "Package environments").
    packages_dir: str | None = None

    def __post_init__(self) -> None:
        if self.language not in LANGUAGES:
            raise SandboxRequestError(f"unsupported language {self.language!r}")
        if self.network not in ("deny", "allow", "restricted"):
            raise SandboxRequestError(f"unknown network mode {self.network!r}")
        if not 0 < self.timeout_seconds <= 24 * 3600:
            raise SandboxRequestError("timeout_seconds must be in (0, 86400]")
        for name in ("output_cap_bytes", "output_file_cap_bytes", "output_total_cap_bytes"):
            _require_positive(name, getattr(self, name))
        _require_positive("output_max_files", self.output_max_files)
        if "\x00" in self.code or (self.stdin is not None and "\x00" in self.stdin):
            raise SandboxRequestError("code and stdin may not contain NUL characters")
        least = MIN_ADDRESS_SPACE.get(self.language)
        if least is not None and self.limits.address_space_for(self.language) < least:
            raise SandboxRequestError(
                f"{self.language} needs an address space of at least {least // MiB} MiB"
            )
        for path in self.files:
            validate_relative_path(path)
        for key, value in self.env.items():
            _validate_env(key, value)
        if self.collect_outputs is not None and "\x00" in self.collect_outputs:
            raise SandboxRequestError("collect_outputs may not contain NUL")
        if self.workdir is not None:
            _validate_workdir(self)
        _validate_masks_and_egress(self)


@dataclass(frozen=True)
class OutputFile:
    """A regular file found under ``out/``; ``data`` is None when it was over a size cap."""

    name: str
    size: int
    data: bytes | None


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    #: The program's exit status; death by signal N is reported as 128 + N, as shells do
    #: (bubblewrap reports it that way, and the rlimit-only backend is normalised to match).
    exit_code: int
    timed_out: bool
    #: Why the run ended early: the runner's own kills (timeout, output_cap, memory watchdog)
    #: and the kernel's limit signals (SIGXCPU -> cpu, SIGXFSZ -> file_size). "memory" is also
    #: reported when the interpreter's own out-of-memory message ends stderr.
    killed_reason: KilledReason | None
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int
    output_files: tuple[OutputFile, ...]
    backend: Backend
    #: Operator-facing remarks: degraded layers, omitted output files, "restricted" downgrade.
    notes: tuple[str, ...] = ()
    #: Sandbox processes still alive after the final sweep; anything but 0 is a containment bug.
    leftover_processes: int = 0


def validate_relative_path(path: str) -> PurePosixPath:
    """A working-directory path: relative, no ``..``, no empty or ``.`` parts, no NUL."""
    pure = PurePosixPath(path)
    if not path or "\x00" in path or pure.is_absolute():
        raise SandboxRequestError(f"file path must be relative: {path!r}")
    if any(part in ("..", ".", "") for part in path.split("/")):
        raise SandboxRequestError(f"file path may not contain '..', '.' or '//': {path!r}")
    return pure


def _validate_workdir(request: SandboxRequest) -> None:
    workdir = request.workdir or ""
    if "\x00" in workdir or not PurePosixPath(workdir).is_absolute():
        raise SandboxRequestError(f"workdir must be an absolute path: {workdir!r}")
    if request.files or request.collect_outputs is not None:
        raise SandboxRequestError("an existing workdir takes no input or output files")


def _validate_masks_and_egress(request: SandboxRequest) -> None:
    if (request.mask_dirs or request.mask_files) and request.workdir is None:
        raise SandboxRequestError("masks apply only to an existing workdir")
    for path in (*request.mask_dirs, *request.mask_files):
        validate_relative_path(path)
    packages = request.packages_dir
    if packages is not None and ("\x00" in packages or not PurePosixPath(packages).is_absolute()):
        raise SandboxRequestError("packages_dir must be an absolute path")
    socket = request.egress_socket
    if socket is not None and ("\x00" in socket or not PurePosixPath(socket).is_absolute()):
        raise SandboxRequestError("egress_socket must be an absolute path")


def _validate_env(key: str, value: str) -> None:
    if not _ENV_NAME.match(key):
        raise SandboxRequestError(f"invalid environment variable name {key!r}")
    if key in RESERVED_ENV:
        raise SandboxRequestError(f"environment variable {key} is controlled by the sandbox")
    if "\x00" in value:
        raise SandboxRequestError(f"environment variable {key} contains NUL")


def _require_positive(name: str, value: int | float) -> None:
    if value <= 0:
        raise SandboxRequestError(f"{name} must be positive, got {value!r}")

"""Per-skill package environments on disk: built outside the sandbox, reused by key (no Django).

An environment is one directory ``<root>/<key>``, the key a hash of (language, interpreter
version, sorted package specs, index URL). It is built in a temporary sibling directory and
renamed into place, under an exclusive ``flock`` of ``<root>/<key>.lock``: two workers never
build one key at once, the second waits and reuses the first one's result, and a half-built
directory is never seen under the final name. Python: ``pip install --target site-packages``,
wheels only (nothing of a package runs on the host at install time), dependencies included;
Node.js: ``npm install --ignore-scripts`` into ``node_modules``. The resolved versions are the
environment's lock (Python: ``name==version`` lines; npm: ``package-lock.json``); a build given a
lock installs exactly it (``pip --no-deps -r`` / ``npm ci``). pip and npm get a minimal
environment (PATH, HOME and caches in a scratch directory; no server secrets).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

#: Written last into a built environment: its pins, lock and size (a directory without it is
#: not an environment).
META_NAME = "loopwright-env.json"
PATH = "/usr/local/bin:/usr/bin:/bin"
#: How much of pip's/npm's output an error keeps.
OUTPUT_TAIL = 3000


class EnvBuildError(Exception):
    """An environment could not be built; ``packages`` are the declared specs at fault."""

    def __init__(self, message: str, packages: list[str] | None = None) -> None:
        super().__init__(message)
        self.packages = packages or []


@dataclass(frozen=True)
class EnvPlan:
    """What an environment holds; equal plans share one directory (``key``)."""

    language: str
    interpreter: str
    interpreter_version: str
    specs: tuple[str, ...]
    index_url: str

    @property
    def key(self) -> str:
        parts = [self.language, self.interpreter_version, sorted(self.specs), self.index_url]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class EnvLimits:
    size_cap_bytes: int
    timeout_seconds: float


@dataclass(frozen=True)
class BuiltEnv:
    path: Path
    pins: list[str]
    lock: str
    size_bytes: int
    #: False when an existing environment was reused.
    built: bool = False
    output: str = field(default="", repr=False)


@functools.lru_cache(maxsize=16)
def interpreter_version(interpreter: str, language: str) -> str:
    """``python 3.11.2`` / ``node v20.1.0``: part of the key, so an upgraded interpreter gets
    a fresh environment (compiled wheels are built for one Python version)."""
    if language == "node":
        argv = [interpreter, "--version"]
    else:
        argv = [
            interpreter,
            "-I",
            "-S",
            "-c",
            "import sys; print('%d.%d.%d' % sys.version_info[:3])",
        ]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=10, env={"PATH": PATH}, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise EnvBuildError(f"the {language} interpreter {interpreter} cannot run: {exc}") from exc
    return f"{language} {done.stdout.strip()}"


def env_path(root: Path, key: str) -> Path | None:
    """The built environment of ``key``, or None."""
    path = root / key
    return path if (path / META_NAME).is_file() else None


def env_read(path: Path) -> BuiltEnv:
    meta = json.loads((path / META_NAME).read_text())
    return BuiltEnv(path=path, pins=list(meta["pins"]), lock=str(meta["lock"]),
                    size_bytes=int(meta["size_bytes"]))  # fmt: skip


def env_ensure(*, root: Path, plan: EnvPlan, lock: str, limits: EnvLimits) -> BuiltEnv:
    """The environment of ``plan``: reused when built, else built now (installing ``lock``
    exactly when given). Raises EnvBuildError naming the packages at fault."""
    try:
        _make_root(root)
        with _flocked(root / f"{plan.key}.lock"):
            existing = root / plan.key
            if existing.exists():
                try:
                    return env_read(existing)
                except (OSError, ValueError, KeyError, TypeError):
                    # Not an environment (no or a damaged record): built again below.
                    _discard(root, plan.key)
            return _build(root, plan, lock, limits)
    except OSError as exc:
        raise EnvBuildError(
            f"the package environment cannot be written under {root}: {exc}", list(plan.specs)
        ) from exc


def env_remove(*, root: Path, key: str) -> bool:
    """Delete the environment of ``key`` (under its lock); False when there was none."""
    if not root.is_dir():
        return False
    with _flocked(root / f"{key}.lock"):
        return _discard(root, key)


def _discard(root: Path, key: str) -> bool:
    """Move ``<root>/<key>`` aside, then delete it: the name is free at once."""
    path = root / key
    if not path.exists():
        return False
    trash = Path(tempfile.mkdtemp(prefix=f".trash-{key}-", dir=root))
    path.rename(trash / "env")
    shutil.rmtree(trash, ignore_errors=True)
    return True


def _make_root(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    # The sandbox uid binds from here: it must be able to traverse it (docs/sandbox.md).
    root.chmod(0o755)


@contextlib.contextmanager
def _flocked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _build(root: Path, plan: EnvPlan, lock: str, limits: EnvLimits) -> BuiltEnv:
    build = Path(tempfile.mkdtemp(prefix=f".build-{plan.key}-", dir=root))
    scratch = Path(tempfile.mkdtemp(prefix=f".scratch-{plan.key}-", dir=root))
    try:
        if plan.language == "node":
            output = _npm(plan, build, scratch, lock, limits.timeout_seconds)
            pins, lock = _npm_pins(build)
        else:
            output = _pip(plan, build, scratch, lock, limits.timeout_seconds)
            pins = _python_pins(build / "site-packages")
            lock = "".join(f"{pin}\n" for pin in pins)
        size = _tree_size(build)
        if size > limits.size_cap_bytes:
            raise EnvBuildError(
                f"the environment of {', '.join(plan.specs)} is {_mb(size)} MB, over the size "
                f"cap of {_mb(limits.size_cap_bytes)} MB (LOOPWRIGHT_SKILL_ENV_MAX_MB); it was "
                "deleted",
                list(plan.specs),
            )
        meta = {"key": plan.key, "pins": pins, "lock": lock, "size_bytes": size,
                "specs": list(plan.specs), "interpreter": plan.interpreter_version}  # fmt: skip
        (build / META_NAME).write_text(json.dumps(meta, indent=1))
        _readable(build)
        final = root / plan.key
        build.rename(final)
        return BuiltEnv(path=final, pins=pins, lock=lock, size_bytes=size, built=True,
                        output=output[-OUTPUT_TAIL:])  # fmt: skip
    finally:
        shutil.rmtree(build, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


def _mb(size: int) -> str:
    return f"{size / (1024 * 1024):.1f}"


def _minimal_env(scratch: Path) -> dict[str, str]:
    home = scratch / "home"
    tmp = scratch / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {"PATH": PATH, "HOME": str(home), "TMPDIR": str(tmp), "LANG": "C.UTF-8"}
    # A proxy an operator set for outbound traffic still applies; nothing else is inherited.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy",
                 "no_proxy"):  # fmt: skip
        if name in os.environ:
            env[name] = os.environ[name]
    return env


@functools.lru_cache(maxsize=8)
def _pip_command(interpreter: str) -> tuple[str, ...]:
    """The interpreter's own pip, else this process's pip aimed at it (``--python``)."""
    probe = [interpreter, "-I", "-c", "import importlib.util as u, sys; "
             "sys.exit(u.find_spec('pip') is None)"]  # fmt: skip
    try:
        own = subprocess.run(probe, capture_output=True, timeout=10, env={"PATH": PATH})
        if own.returncode == 0:
            return (interpreter, "-I", "-m", "pip")
    except (OSError, subprocess.SubprocessError):
        pass
    return (sys.executable, "-I", "-m", "pip", "--python", interpreter)


def _pip(plan: EnvPlan, build: Path, scratch: Path, lock: str, timeout: float) -> str:
    argv = [*_pip_command(plan.interpreter), "install", "--isolated", "--no-input",
            "--disable-pip-version-check", "--no-cache-dir", "--no-compile",
            "--progress-bar", "off", "--only-binary=:all:", "--target",
            str(build / "site-packages"), "--index-url", plan.index_url]  # fmt: skip
    if lock.strip():
        requirements = scratch / "requirements.txt"
        requirements.write_text(lock)
        argv += ["--no-deps", "-r", str(requirements)]
    else:
        argv += ["--", *plan.specs]
    code, output = _run(argv, build, _minimal_env(scratch), timeout, "pip")
    if code != 0:
        raise EnvBuildError(_failure("pip", plan, output), _culprits(plan, output))
    return output


def _npm(plan: EnvPlan, build: Path, scratch: Path, lock: str, timeout: float) -> str:
    npm = shutil.which("npm", path=PATH)
    if npm is None:
        raise EnvBuildError("npm is not installed on this skills worker", list(plan.specs))
    deps = dict(_npm_split(spec) for spec in plan.specs)
    manifest = {"name": "loopwright-skill-env", "version": "0.0.0", "private": True,
                "dependencies": deps}  # fmt: skip
    (build / "package.json").write_text(json.dumps(manifest, indent=1))
    npmrc, global_npmrc = scratch / "npmrc", scratch / "global-npmrc"
    npmrc.write_text("")
    global_npmrc.write_text("")
    common = ["--ignore-scripts", "--no-audit", "--no-fund", "--no-update-notifier",
              "--registry", plan.index_url, "--cache", str(scratch / "npm-cache"),
              "--userconfig", str(npmrc), "--globalconfig", str(global_npmrc),
              "--prefix", str(build), "--no-bin-links"]  # fmt: skip
    if lock.strip():
        (build / "package-lock.json").write_text(lock)
        argv = [npm, "ci", *common]
    else:
        argv = [npm, "install", *common]
    env = _minimal_env(scratch)
    env["NPM_CONFIG_UPDATE_NOTIFIER"] = "false"
    code, output = _run(argv, build, env, timeout, "npm")
    if code != 0:
        raise EnvBuildError(_failure("npm", plan, output), _culprits(plan, output))
    return output


def _npm_split(spec: str) -> tuple[str, str]:
    at = spec.rfind("@")
    return (spec[:at], spec[at + 1 :]) if at > 0 else (spec, "*")


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float, tool: str
         ) -> tuple[int, str]:  # fmt: skip
    """Run pip/npm in a session of its own; past ``timeout`` the whole group is killed."""
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise EnvBuildError(
            f"{tool} did not finish within {timeout:g} s (LOOPWRIGHT_SKILL_ENV_BUILD_TIMEOUT); "
            "the build was stopped"
        ) from None
    return proc.returncode, out.decode(errors="replace")


#: Names pip and npm print for what they could not get.
_PIP_MISSES = (
    re.compile(r"No matching distribution found for ([A-Za-z0-9._-]+)"),
    re.compile(r"satisfies the requirement ([A-Za-z0-9._-]+)"),
)
_NPM_MISSES = (
    re.compile(r"'((?:@[^/'\s]+/)?[^@'\s]+)@[^']*' is not in (?:this|the npm) registry"),
    re.compile(r"No matching version found for ((?:@[^/\s]+/)?[^@\s]+)@"),
    re.compile(r"404 Not Found - GET \S+/((?:@[^/\s]+(?:/|%2[fF]))?[^/\s]+) "),
)


#: npm's lines that say nothing about the failure (the debug log is deleted with the scratch).
_NOISE = re.compile(r"complete log of this run|Note that you can also|tarball, folder, http")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.replace("%2f", "/").replace("%2F", "/")).lower()


def _spec_name(spec: str, language: str) -> str:
    if language == "node":
        return _npm_split(spec)[0]
    return spec.split("==", 1)[0]


def _culprits(plan: EnvPlan, output: str) -> list[str]:
    """The declared specs the tool's output names (all of them when it names none: the
    failure is then the set's, a conflict or an unreachable index)."""
    patterns = _NPM_MISSES if plan.language == "node" else _PIP_MISSES
    named = {_canonical(m) for p in patterns for m in p.findall(output)}
    hits = [s for s in plan.specs if _canonical(_spec_name(s, plan.language)) in named]
    return hits or list(plan.specs)


def _failure(tool: str, plan: EnvPlan, output: str) -> str:
    culprits = _culprits(plan, output)
    names = ", ".join(f"'{c}'" for c in culprits)
    lines = [ln.strip() for ln in output.splitlines()
             if "ERR" in ln.upper() and not _NOISE.search(ln)]  # fmt: skip
    detail = " | ".join(lines[-4:])[-600:] or output.strip()[-600:]
    head = "package" if len(culprits) == 1 else "packages"
    return (
        f"{head} {names} cannot be installed from {plan.index_url} ({tool}: {detail}); "
        "packages are PyPI distribution or npm package names, and Python packages must come "
        "as wheels (docs/skills.md)"
    )


#: A pin as it goes into the lock's requirement lines: a name and a version, nothing a
#: requirements file could read as an option (a package's METADATA is the index's text).
_PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*$")


def _python_pins(site: Path) -> list[str]:
    pins = []
    for info in site.glob("*.dist-info"):
        metadata = info / "METADATA"
        if metadata.is_file():
            headers = HeaderParser().parsestr(metadata.read_text(errors="replace"))
            pin = f"{headers['Name']}=={headers['Version']}".strip()
            if not _PIN.fullmatch(pin):
                raise EnvBuildError(f"an installed distribution has an unusable name: {pin!r}")
            pins.append(pin)
    return sorted(pins, key=str.lower)


def _npm_pins(build: Path) -> tuple[list[str], str]:
    lock_path = build / "package-lock.json"
    lock = lock_path.read_text() if lock_path.is_file() else "{}"
    packages = json.loads(lock).get("packages", {})
    pins = set()
    for where, entry in packages.items():
        if where and isinstance(entry, dict) and "version" in entry:
            pins.add(f"{where.rsplit('node_modules/', 1)[-1]}@{entry['version']}")
    return sorted(pins), lock


def _tree_size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _readable(path: Path) -> None:
    """Everything readable (and directories traversable) by the sandbox uid, writable by
    nobody but the owner; the sandbox binds it read-only besides."""
    for dirpath, dirs, files in os.walk(path):
        os.chmod(dirpath, 0o755)  # noqa: S103 (the sandbox uid reads it; nobody else writes)
        for name in files:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                os.chmod(full, 0o755 if os.access(full, os.X_OK) else 0o644)
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(dirpath, d))]

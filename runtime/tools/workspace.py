"""Confinement of the file tools to one working directory.

A path is resolved to its *real* path (every symlink followed) and must stay inside the real
working directory; a lexically harmless path that a symlink sends outside is refused with a
message that says so. The check and the later open are separate system calls, so a symlink
swapped in between could still redirect the open: every opened descriptor is therefore checked
again through ``/proc/self/fd`` (where the platform has it), files are opened with
``O_NOFOLLOW``, and writes go to a temporary file in a verified directory descriptor and are
renamed over the target, which replaces a symlink instead of writing through it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import stat
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from runtime.tools.base import Invocation, ToolError

#: Refused by default: Git internals (hooks run code), environment files and private keys.
DEFAULT_DENY_PATTERNS: tuple[str, ...] = (
    ".git",
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "id_rsa*",
    "id_ecdsa*",
    "id_ed25519*",
)

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


@dataclass(frozen=True)
class PathTarget:
    """A path inside the workspace: as the model wrote it, resolved, and workdir-relative."""

    given: str
    real: Path
    relative: str


def denied_by(relative: str, patterns: tuple[str, ...]) -> str | None:
    """The deny pattern that covers ``relative``, if any.

    A pattern without ``/`` matches any single path component (``.git`` covers ``.git/hooks``);
    one with ``/`` matches the path or one of its parent directories (``secrets/*``).
    """
    path = PurePosixPath(relative)
    prefixes = [path, *path.parents]
    for pattern in patterns:
        if "/" in pattern:
            clean = pattern.strip("/")
            if any(fnmatch.fnmatchcase(str(p), clean) for p in prefixes):
                return pattern
        elif any(fnmatch.fnmatchcase(part, pattern) for part in path.parts):
            return pattern
    return None


@dataclass(frozen=True)
class PathRules:
    """The harness's ``paths`` section of the calling invocation, as the tools apply it.

    Read from ``ToolContext.invocation.harness`` (the role's compiled settings); no
    invocation or no ``paths`` section adds nothing to the registry's own defaults.
    """

    deny: tuple[str, ...] = ()
    max_files: int | None = None
    #: The layers that decided each field (snapshot provenance), for the refusal messages.
    deny_layer: str = ""
    max_files_layer: str = ""

    @classmethod
    def of(cls, invocation: Invocation | None) -> PathRules:
        settings: Mapping[str, Any] = (invocation.harness if invocation else None) or {}
        paths = settings.get("paths") or {}
        provenance = (invocation.harness_provenance if invocation else None) or {}
        deny = paths.get("deny") or ()
        max_files = paths.get("maxFiles")
        return cls(
            deny=tuple(str(p) for p in deny if isinstance(p, str) and p.strip("/")),
            max_files=max_files if isinstance(max_files, int) and max_files >= 0 else None,
            deny_layer=_layer(provenance.get("paths.deny")),
            max_files_layer=_layer(provenance.get("paths.maxFiles")),
        )

    def denied(self, relative: str) -> str | None:
        """The refusal for a workdir-relative path the harness denies, or None."""
        pattern = denied_by(relative, self.deny) or denied_below(relative, self.deny)
        if pattern is None or relative == ".":
            return None
        return f"refused by paths.deny {pattern!r}{self.deny_layer}"

    def deny_reason(self) -> str:
        return f"denied by paths.deny{self.deny_layer}"

    def max_files_reason(self) -> str:
        return f"paths.maxFiles = {self.max_files}{self.max_files_layer}"


def _layer(value: Any) -> str:
    if not value:
        return ""
    if isinstance(value, list | tuple):
        value = ", ".join(str(v) for v in value)
    return f" (set by {value})"


def denied_below(relative: str, patterns: tuple[str, ...]) -> str | None:
    """The pattern that denies *everything below* ``relative`` (``secrets/**`` or
    ``secrets/*`` for ``secrets``), if any: such a directory is itself treated as denied (not
    listed, not opened, hidden whole from bash)."""
    if relative == ".":
        return None
    for pattern in patterns:
        clean = pattern.strip("/")
        for suffix in ("/**", "/*"):
            # "<dir>/" has a "/", so it matches the path itself or one of its parents.
            if clean.endswith(suffix) and denied_by(relative, (clean[: -len(suffix)] + "/",)):
                return pattern
    return None


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


class Workspace:
    def __init__(
        self,
        workdir: str | None,
        deny_patterns: tuple[str, ...],
        rules: PathRules | None = None,
    ) -> None:
        if not workdir:
            raise ToolError("This invocation has no working directory, so file tools are off.")
        root = Path(os.path.realpath(workdir))
        if not root.is_dir():
            raise ToolError(f"The working directory {workdir!r} does not exist.")
        self.root = root
        #: The working directory as given (it may itself be reached through a symlink).
        self.given_root = Path(os.path.abspath(workdir))
        self.deny_patterns = deny_patterns
        self.rules = rules or PathRules()

    def _lexical_relative(self, given: str) -> str | None:
        """``given`` relative to the workspace with ``..`` folded, or None when outside."""
        path = Path(os.path.normpath(given if os.path.isabs(given) else self.root / given))
        for base in (self.root, self.given_root):
            if _inside(path, base):
                return path.relative_to(base).as_posix()
        return None

    def resolve(self, given: str) -> PathTarget:
        """Resolve a model-given path, refusing anything outside the workspace or denied."""
        if not given or "\x00" in given:
            raise ToolError("Give a non-empty path relative to the working directory.")
        lexical = self._lexical_relative(given)
        real = Path(os.path.realpath(self.root / lexical)) if lexical is not None else None
        if lexical is None or real is None or not _inside(real, self.root):
            why = "is" if lexical is None else "resolves through a symlink to"
            raise ToolError(
                f"Path {given!r} {why} a location outside the working directory, which is "
                "not allowed. Use a path inside it, relative to the working directory."
            )
        relative = real.relative_to(self.root).as_posix()
        for name in (relative, lexical):
            pattern = denied_by(name, self.deny_patterns)
            if pattern and name != ".":
                raise ToolError(f"Path {given!r} is protected (deny pattern {pattern!r}).")
            refusal = self.rules.denied(name)
            if refusal:
                raise ToolError(
                    f"Path {given!r} is {refusal}: the harness keeps it from every file tool "
                    "and bash. Work without it."
                )
        return PathTarget(given=given, real=real, relative=relative)

    def hidden(self, relative: str) -> bool:
        """Whether a listing leaves ``relative`` out (a default or a harness deny)."""
        return bool(denied_by(relative, self.deny_patterns) or self.rules.denied(relative))

    def verify_descriptor(self, fd: int, target: PathTarget) -> None:
        """Refuse a descriptor that ended up outside the workspace (a symlink swapped in)."""
        try:
            opened = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            return  # no /proc here: the resolve-time check is all there is
        if not _inside(opened, self.root):
            raise ToolError(
                f"Path {target.given!r} changed to point outside the working "
                "directory while it was being opened; refused."
            )

    def read_bytes(self, target: PathTarget, max_bytes: int) -> tuple[bytes, int]:
        """Up to ``max_bytes`` of a regular file, and the file's full size."""
        fd = _open(target, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
        try:
            self.verify_descriptor(fd, target)
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                raise ToolError(f"{target.given!r} is a directory; use the list tool.")
            if not stat.S_ISREG(info.st_mode):
                raise ToolError(f"{target.given!r} is not a regular file.")
            with os.fdopen(os.dup(fd), "rb") as handle:
                return handle.read(max_bytes), info.st_size
        finally:
            os.close(fd)

    def write_bytes(self, target: PathTarget, data: bytes) -> None:
        """Replace the file's content atomically (temporary file + rename, both fsynced)."""
        if target.real == self.root:
            raise ToolError("The working directory itself cannot be written as a file.")
        try:
            target.real.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ToolError(f"A parent of {target.given!r} is a file, not a directory.") from None
        dir_fd = _open(target, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC, path=target.real.parent)
        try:
            self.verify_descriptor(dir_fd, target)
            mode = _existing_mode(target, dir_fd)
            _replace_in_dir(dir_fd, target.real.name, data, mode)
        except OSError as exc:
            raise ToolError(f"{target.given!r} could not be written: {exc.strerror}.") from None
        finally:
            os.close(dir_fd)


def _open(target: PathTarget, flags: int, path: Path | None = None) -> int:
    try:
        return os.open(path or target.real, flags)
    except FileNotFoundError:
        raise ToolError(
            f"{target.given!r} does not exist. Use the list tool to see what is there."
        ) from None
    except NotADirectoryError:
        raise ToolError(f"A parent of {target.given!r} is a file, not a directory.") from None
    except OSError as exc:
        raise ToolError(f"{target.given!r} cannot be opened: {exc.strerror}.") from None


def _existing_mode(target: PathTarget, dir_fd: int) -> int | None:
    try:
        info = os.stat(target.real.name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        raise ToolError(f"{target.given!r} became a symlink while it was being written; refused.")
    if stat.S_ISDIR(info.st_mode):
        raise ToolError(f"{target.given!r} is a directory, not a file.")
    return stat.S_IMODE(info.st_mode)


def _replace_in_dir(dir_fd: int, name: str, data: bytes, mode: int | None) -> None:
    temporary = f".{name}.{uuid.uuid4().hex[:12]}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
    fd = os.open(temporary, flags, 0o666, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if mode is not None:
                os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _unlink_quietly(temporary, dir_fd)
        raise
    # The rename is durable only once the directory itself is synced.
    os.fsync(dir_fd)


def _unlink_quietly(name: str, dir_fd: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=dir_fd)

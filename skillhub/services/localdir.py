"""``local-dir`` skill sources: folders under the roots an admin lists, nothing else.

The rule, checked when a skill is saved and again each time its folder is copied into the
sandbox (the folder may have changed since):

- roots come from ``LOOPWRIGHT_SKILL_LOCAL_ROOTS`` (absolute directories, separated by
  ``os.pathsep`` or commas); there are none by default, so every local-dir skill is refused;
  ``/`` (or anything resolving to it) and host system directories are never roots;
- ``source_ref`` is absolute, without ``..`` segments; its resolved path (``realpath``, so a
  symlink leading out counts where it leads) lies inside a resolved root;
- the service's var directory (``LOOPWRIGHT_VAR_DIR``: workspaces, ledgers, the admin password,
  SQLite files, the broker), the run workspaces directory, the sandbox's run directories and
  host system directories are never allowed, nor is a folder that contains one of them.

The copy never follows a symlink: the folder is walked through directory descriptors opened
with ``O_NOFOLLOW``. A symlink leading out of the folder is refused (at save time too, when the
folder exists on the API's host); one pointing inside it is skipped (its target is copied under
its own name), so is everything that is not a regular file or directory; the total stays under
``LOCAL_DIR_MAX_BYTES``.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field

from django.conf import settings

from orchestrator.paths import workspaces_root
from sandbox import MiB, SandboxConfig, SandboxError

logger = logging.getLogger(__name__)

SETTING = "LOOPWRIGHT_SKILL_LOCAL_ROOTS"
#: Largest local-dir skill folder copied into the sandbox.
LOCAL_DIR_MAX_BYTES = 50 * MiB
#: Most entries (files, folders, links) a skill folder may hold.
MAX_ENTRIES = 50_000
#: Host directories that are never a root nor a skill folder, whatever the roots say.
SYSTEM_DIRS = ("/etc", "/root", "/proc", "/sys", "/dev", "/boot", "/run")
#: Name prefixes of the sandbox's per-run directories in its work root (sandbox).
_RUNDIR_PREFIXES = ("loopwright-sbx-", "loopwright-probe-")
_NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


class LocalDirRefused(SandboxError):
    """A local-dir folder the rule does not allow; the message names the rule."""


def parse_local_roots(value: str | None) -> tuple[str, ...]:
    """The roots of ``LOOPWRIGHT_SKILL_LOCAL_ROOTS`` (normalised, not resolved); ValueError
    naming the setting for a relative path, ``/`` or a host system directory."""
    roots: list[str] = []
    for part in (value or "").replace(",", os.pathsep).split(os.pathsep):
        text = part.strip()
        if not text:
            continue
        problem = _root_problem(text)
        if problem:
            raise ValueError(f"{SETTING}: {text!r} {problem}")
        roots.append(os.path.normpath(text))
    return tuple(dict.fromkeys(roots))


def _root_problem(root: str) -> str | None:
    if "\x00" in root or not os.path.isabs(root):
        return "is not an absolute directory path"
    resolved = os.path.realpath(root)
    if resolved == "/":
        return "resolves to '/': the whole host cannot be a skill root"
    system = _system_dir(resolved)
    if system:
        return f"lies in {system}, a host system directory, which is never a skill root"
    return None


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _system_dir(resolved: str) -> str | None:
    return next((d for d in SYSTEM_DIRS if _inside(resolved, d)), None)


@dataclass(frozen=True)
class _Forbidden:
    path: str
    label: str


def _forbidden() -> list[_Forbidden]:
    """Resolved directories a skill folder may neither lie in nor contain."""
    var = "the service's var directory (LOOPWRIGHT_VAR_DIR)"
    found = [
        _Forbidden(os.path.realpath(settings.VAR_DIR), var),
        _Forbidden(os.path.realpath(workspaces_root()), "the run workspaces directory"),
    ]
    found += [_Forbidden(d, "a host system directory") for d in SYSTEM_DIRS]
    return found


def _sandbox_work_root() -> str:
    return os.path.realpath(SandboxConfig.from_env().resolved_work_root())


def _in_sandbox_rundir(resolved: str, work_root: str) -> bool:
    if not _inside(resolved, work_root) or resolved == work_root:
        return False
    first = resolved[len(work_root.rstrip("/")) + 1 :].split("/", 1)[0]
    return first.startswith(_RUNDIR_PREFIXES)


def configured_roots() -> list[str]:
    """The usable roots, resolved; a root that resolves to ``/`` or into a system directory
    (possible only through a settings override or a symlink changed later) is ignored."""
    roots = []
    for root in settings.SKILLHUB.get("LOCAL_ROOTS", ()) or ():
        problem = _root_problem(str(root))
        if problem:
            logger.warning("ignoring skill root %r from %s: it %s", root, SETTING, problem)
            continue
        roots.append(os.path.realpath(root))
    return roots


def local_dir_check(ref: str) -> str:
    """The resolved folder of a local-dir ``source_ref``; LocalDirRefused naming the rule."""
    roots = configured_roots()
    if not roots:
        raise LocalDirRefused(
            f"local-dir skills are off: no folder is allowed until an admin lists skill roots "
            f"in {SETTING} (none by default)"
        )
    if not isinstance(ref, str) or "\x00" in ref or not os.path.isabs(ref):
        raise LocalDirRefused("a local-dir skill needs an absolute directory path")
    if ".." in ref.split("/"):
        raise LocalDirRefused(f"{ref!r} has a '..' segment; give the folder's plain path")
    resolved = os.path.realpath(ref)
    shown = ref if resolved == os.path.normpath(ref) else f"{ref} (resolves to {resolved})"
    if not any(_inside(resolved, root) for root in roots):
        raise LocalDirRefused(
            f"{shown} is outside every skill root allowed by {SETTING} ({', '.join(roots)})"
        )
    for item in _forbidden():
        if _inside(resolved, item.path):
            raise LocalDirRefused(f"{shown} lies in {item.label}, which is never allowed")
        if _inside(item.path, resolved):
            raise LocalDirRefused(f"{shown} contains {item.label}, which is never allowed")
    work_root = _sandbox_work_root()
    if _in_sandbox_rundir(resolved, work_root) or _inside(work_root, resolved):
        raise LocalDirRefused(f"{shown} is or holds the sandbox's run directories")
    return resolved


def local_dir_validate(ref: str) -> None:
    """The save-time check: ``local_dir_check``, then, when the folder exists here, a scan of it
    without reading files (a symlink leading out of it is refused). A folder missing on this
    host (it may exist only on the skills workers) is checked when it is copied."""
    resolved = local_dir_check(ref)
    if os.path.isdir(resolved):
        _scan(ref, resolved, max_bytes=None)


@dataclass
class LocalCopy:
    """A folder's files (relative path -> bytes) and the entries that were not copied."""

    files: dict[str, bytes] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


def local_dir_files(ref: str, max_bytes: int = LOCAL_DIR_MAX_BYTES) -> LocalCopy:
    """Copy a local-dir skill's folder (checked again first) without following any symlink;
    LocalDirRefused when the rule refuses it, it is missing or unreadable, holds a symlink
    leading out of it, or is over ``max_bytes``. Symlinks inside it are skipped, not copied."""
    return _scan(ref, local_dir_check(ref), max_bytes=max_bytes)


def _scan(ref: str, resolved: str, max_bytes: int | None) -> LocalCopy:
    try:
        top = os.open(resolved, _NOFOLLOW | os.O_DIRECTORY)
    except OSError as exc:
        raise LocalDirRefused(
            f"the skill's folder {ref} cannot be opened: {exc.strerror}"
        ) from None
    try:
        if os.readlink(f"/proc/self/fd/{top}") != resolved:  # swapped since the check
            raise LocalDirRefused(f"the skill's folder {ref} changed while it was opened")
        walk = _Walk(resolved, max_bytes)
        walk.directory(top, "")
        return walk.copy
    except OSError as exc:
        raise LocalDirRefused(f"the skill's folder {ref} cannot be read: {exc}") from None
    finally:
        os.close(top)


class _Walk:
    """One walk through directory descriptors (``O_NOFOLLOW``); reads files unless
    ``max_bytes`` is None (the save-time scan)."""

    def __init__(self, base: str, max_bytes: int | None) -> None:
        self.base = base
        self.max_bytes = max_bytes
        self.copy = LocalCopy()
        self.total = 0
        self.entries = 0
        self.forbidden = _forbidden_ids()

    def directory(self, dir_fd: int, prefix: str) -> None:
        with os.scandir(dir_fd) as entries:
            names = sorted(entry.name for entry in entries)
        self.entries += len(names)
        if self.entries > MAX_ENTRIES:
            raise LocalDirRefused(f"the skill's folder holds more than {MAX_ENTRIES} entries")
        for name in names:
            if name != ".git":
                self.entry(dir_fd, prefix, name)

    def entry(self, dir_fd: int, prefix: str, name: str) -> None:
        rel = f"{prefix}{name}"
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            target = os.path.realpath(os.path.join(self.base, rel))
            if not _inside(target, self.base):
                raise LocalDirRefused(
                    f"{rel} in the skill's folder is a symlink leading out of it (to {target}); "
                    "symlinks are never followed: remove it or copy the file in"
                )
            self.copy.skipped.append(rel)  # a link inside the folder: its target is copied
        elif stat.S_ISDIR(st.st_mode):
            if (st.st_dev, st.st_ino) in self.forbidden:
                raise LocalDirRefused(f"{rel} in the skill's folder is a protected directory")
            child = os.open(name, _NOFOLLOW | os.O_DIRECTORY, dir_fd=dir_fd)
            try:
                self.directory(child, rel + "/")
            finally:
                os.close(child)
        elif stat.S_ISREG(st.st_mode):
            if self.max_bytes is not None:
                self.copy.files[rel] = self.read(dir_fd, name, self.max_bytes)
        else:  # sockets, FIFOs, devices
            self.copy.skipped.append(rel)

    def read(self, dir_fd: int, name: str, max_bytes: int) -> bytes:
        fd = os.open(name, _NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced since the stat
                raise LocalDirRefused(f"{name} changed while the skill's folder was copied")
            chunks = []
            while chunk := os.read(fd, 1024 * 1024):
                self.total += len(chunk)
                if self.total > max_bytes:
                    raise LocalDirRefused(f"the skill's local directory is over {max_bytes} bytes")
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)


def _forbidden_ids() -> set[tuple[int, int]]:
    ids = set()
    for path in [item.path for item in _forbidden()] + [_sandbox_work_root()]:
        try:
            st = os.stat(path)
        except OSError:
            continue
        ids.add((st.st_dev, st.st_ino))
    return ids

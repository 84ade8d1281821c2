"""The per-run directory: program, input files, the writable work dir and its ``out/`` files.

Layout (host side)::

    <work_root>/loopwright-sbx-XXXX/   0711, runner-owned: the sandbox uid may pass, not list
        main.py | main.js | main.ts    0444, bound read-only at /code/
        passwd, group                  0444, a one-user passwd for getpwuid()/os.userInfo()
        work/                          0700, sandbox uid: bound read-write at /workdir
            out/                       files the caller collects
        tmp/                           0700, sandbox uid: TMPDIR of the rlimit-only backend

A borrowed directory (``SandboxRequest.workdir``, the agent's ``bash`` tool) is used instead
of ``work/``. With a dedicated uid it is lent to that uid for the run: chowned top first, and
given back bottom-up with the top last, so whenever anything in it belongs to a sandbox uid its
top does too, and :func:`workdir_reclaim` (one ``lstat`` when nothing is lent) repairs what a
runner killed mid-run left. When the runner may mount (``bind_privately``), ``work/`` is an
empty mount point that a private mount namespace, set up as root before the uid drop, binds the
borrowed directory onto (``command.host_prefix``): the sandbox uid then reaches it through the
run directory and needs no search permission on the directory's own parents.

Outputs are read by the runner, which may be root, after every sandbox process is dead. The
program controls what ``out/`` contains, so a symlink there must never be followed: the walk
uses directory descriptors (``os.fwalk``) and opens files with ``O_NOFOLLOW``, so a link to
``/etc/shadow`` or a linked directory is skipped rather than read with the runner's rights.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.types import (
    Language,
    OutputFile,
    SandboxRequest,
    SandboxRequestError,
    validate_relative_path,
)

SANDBOX_USER = 65534
#: Deno's file is TypeScript (a plain JavaScript program is valid TypeScript): types are
#: stripped, never checked (``deno run`` does not type-check).
CODE_NAMES: Mapping[Language, str] = {"python": "main.py", "node": "main.js", "deno": "main.ts"}
_PASSWD = "sandbox:x:65534:65534:sandbox:/workdir:/usr/sbin/nologin\n"  # noqa: S105 (no secret)
_GROUP = "sandbox:x:65534:\n"


@dataclass(frozen=True)
class RunDir:
    root: Path
    code: Path
    passwd: Path
    group: Path
    work: Path
    tmp: Path
    #: An existing directory used as ``work`` (``SandboxRequest.workdir``): its owner before
    #: the run, restored by ``rundir_remove``; None when it was not handed to another uid.
    borrowed_owner: tuple[int, int] | None = None
    #: The empty directory of the run directory that ``work`` is bound onto in the run's
    #: private mount namespace (and that bubblewrap binds at /workdir); None: bwrap binds
    #: ``work`` itself.
    bind_point: Path | None = None

    @property
    def out(self) -> Path:
        return self.work / "out"


def rundir_prefix(uid: int | None) -> str:
    """Run directories of a slot carry its uid, so a crashed run's can be found, and two
    uid ranges sharing a work root never sweep each other's."""
    return "loopwright-sbx-" if uid is None else f"loopwright-sbx-u{uid}-"


def rundir_create(
    *,
    work_root: str,
    request: SandboxRequest,
    owner: tuple[int, int] | None,
    uid: int | None = None,
    bind_privately: bool = False,
    sandbox_uids: range = range(0),
) -> RunDir:
    """Create and fill the run directory; ``owner`` (uid, gid) gets the writable parts.

    A borrowed directory is first reclaimed from ``sandbox_uids`` (a killed runner's lending,
    :func:`workdir_reclaim`), so its recorded owner is never a sandbox uid; with
    ``bind_privately`` it is reached through the run directory's ``work/`` mount point.
    """
    searchable = owner is not None and not bind_privately
    borrowed = _borrowed_workdir(request.workdir, must_be_searchable=searchable)
    if borrowed is not None and owner is not None:
        workdir_reclaim(borrowed, sandbox_uids)
    root = Path(tempfile.mkdtemp(prefix=rundir_prefix(uid), dir=work_root))
    # Traverse-only for others: bwrap, running as the sandbox uid, must reach work/ and the
    # program to bind them, but may not list the directory.
    os.chmod(root, 0o711)  # noqa: S103
    rundir = RunDir(
        root=root,
        code=root / CODE_NAMES[request.language],
        passwd=root / "passwd",
        group=root / "group",
        work=borrowed or root / "work",
        tmp=root / "tmp",
        borrowed_owner=_owner_of(borrowed) if borrowed and owner is not None else None,
        bind_point=root / "work" if borrowed and bind_privately else None,
    )
    try:
        _write_readonly(rundir.code, request.code.encode())
        _write_readonly(rundir.passwd, _PASSWD.encode())
        _write_readonly(rundir.group, _GROUP.encode())
        made = [rundir.tmp] if borrowed else [rundir.work, rundir.out, rundir.tmp]
        if rundir.bind_point is not None:
            made.append(rundir.bind_point)
        for directory in made:
            directory.mkdir(mode=0o700)
        for relative, content in request.files.items():
            _write_input(rundir.work, relative, content)
        if owner is not None:
            _lend_tree(rundir.work, owner)
            _lend_tree(rundir.tmp, owner)
    except BaseException:
        rundir_remove(rundir)
        raise
    return rundir


def _borrowed_workdir(workdir: str | None, *, must_be_searchable: bool) -> Path | None:
    """The caller's existing working directory, which must be a real (unlinked) directory.

    When bubblewrap binds it directly as a dedicated sandbox uid (no private mount namespace:
    ``must_be_searchable``), every parent must be searchable by others, or the bind fails.
    """
    if workdir is None:
        return None
    if os.path.realpath(workdir) != os.path.normpath(workdir) or not os.path.isdir(workdir):
        raise SandboxRequestError(f"workdir {workdir!r} is not an existing, unlinked directory")
    path = Path(workdir)
    if must_be_searchable:
        for parent in path.parents:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                raise SandboxRequestError(
                    f"workdir {workdir!r}: the sandbox uid cannot reach it because {parent} "
                    "is not searchable by others (chmod o+x, or use another directory)"
                )
    return path


def _owner_of(path: Path) -> tuple[int, int]:
    info = os.stat(path, follow_symlinks=False)
    return info.st_uid, info.st_gid


def _write_readonly(path: Path, content: bytes) -> None:
    path.write_bytes(content)
    os.chmod(path, 0o444)


def _write_input(work: Path, relative: str, content: bytes) -> None:
    pure = validate_relative_path(relative)
    target = work.joinpath(*pure.parts)
    try:
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(target, flags, 0o644)
    except (FileExistsError, NotADirectoryError) as exc:
        raise SandboxRequestError(f"input file {relative!r} clashes with another: {exc}") from exc
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)


def _lend_tree(top: Path, owner: tuple[int, int]) -> None:
    """Chown ``top`` first, then everything below it (links themselves, never followed)."""
    uid, gid = owner
    os.chown(top, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def _return_tree(top: Path, owner: tuple[int, int], only: range | None = None) -> int:
    """Chown everything below ``top`` bottom-up, then ``top`` last (links never followed);
    with ``only``, just the entries whose uid or gid is in it. Returns the entries changed."""
    uid, gid = owner
    changed = 0
    for dirpath, dirnames, filenames in os.walk(top, topdown=False):
        for name in dirnames + filenames:
            changed += _chown_entry(os.path.join(dirpath, name), uid, gid, only)
    return changed + _chown_entry(str(top), uid, gid, only)


def _chown_entry(path: str, uid: int, gid: int, only: range | None) -> int:
    try:
        info = os.lstat(path)
        if only is not None and info.st_uid not in only and info.st_gid not in only:
            return 0
        os.chown(path, uid, gid, follow_symlinks=False)
    except FileNotFoundError:
        return 0
    return 1


def workdir_lent(path: str | Path, sandbox_uids: range) -> bool:
    """Is ``path`` (a borrowed work directory) still lent to a sandbox uid? One ``lstat``."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    return info.st_uid in sandbox_uids or info.st_gid in sandbox_uids


def workdir_reclaim(
    path: str | Path, sandbox_uids: range, owner: tuple[int, int] | None = None
) -> int:
    """Give back to ``owner`` (default: this process's uid and gid, the service user) every
    entry of ``path`` that a uid or gid of ``sandbox_uids`` owns, as a runner killed while it
    had lent the directory leaves it. Returns the entries changed; 0 after one ``lstat`` when
    the top is not lent (lending chowns it first, returning last). Links are never followed.
    """
    if not workdir_lent(path, sandbox_uids):
        return 0
    return _return_tree(Path(path), owner or (os.geteuid(), os.getegid()), only=sandbox_uids)


def rundir_remove(rundir: RunDir) -> None:
    """Delete the run directory, whatever modes the program left on what it created."""

    top = os.path.abspath(rundir.root)

    def unlock_and_retry(func: Callable[..., Any], failed: str, exc: object) -> None:
        # A non-root runner cannot enter a directory the program chmod-ed to 0; root can.
        # Only directories inside the run directory are ever unlocked (never its parent,
        # the shared work root), and what is already gone stays gone.
        error = exc[1] if isinstance(exc, tuple) else exc
        if isinstance(error, FileNotFoundError):
            return
        for candidate in (os.path.dirname(failed), failed):
            inside = candidate == top or candidate.startswith(top + os.sep)
            if inside and os.path.isdir(candidate) and not os.path.islink(candidate):
                os.chmod(candidate, 0o700)
        func(failed)

    if sys.version_info >= (3, 12):
        shutil.rmtree(rundir.root, onexc=unlock_and_retry)
    else:  # onerror is deprecated from 3.12 on; 3.11 only has it
        shutil.rmtree(rundir.root, onerror=unlock_and_retry)
    if rundir.borrowed_owner is not None:
        # Every sandbox process is dead: hand the borrowed directory back (links unfollowed),
        # its top last, so a kill meanwhile leaves it visibly lent (``workdir_reclaim``).
        _return_tree(rundir.work, rundir.borrowed_owner)


def rundirs_remove_stale(work_root: str, uid: int) -> None:
    """Delete run directories a crashed holder of the slot of ``uid`` left behind (its
    processes are already dead: the slot was swept)."""
    for path in Path(work_root).glob(f"{rundir_prefix(uid)}*"):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)  # fd-based: never follows a planted link


@dataclass(frozen=True)
class OutputCaps:
    pattern: str
    file_bytes: int
    total_bytes: int
    max_files: int


def outputs_collect(out_dir: Path, caps: OutputCaps) -> tuple[list[OutputFile], list[str]]:
    """Regular files under ``out_dir`` matching the pattern, with the caps applied.

    Returns the files (``data`` None when a cap left it out) and notes for the operator.
    """
    files: list[OutputFile] = []
    notes: list[str] = []
    budget = caps.total_bytes
    for name, size, dir_fd, filename in _matching_files(out_dir, caps.pattern):
        if len(files) >= caps.max_files:
            notes.append(f"output files beyond the first {caps.max_files} were not collected")
            break
        if size > caps.file_bytes or size > budget:
            notes.append(f"output file {name} ({size} bytes) omitted: over the size cap")
            files.append(OutputFile(name=name, size=size, data=None))
            continue
        data = _read_nofollow(dir_fd, filename, size)
        if data is None:
            continue
        budget -= len(data)
        files.append(OutputFile(name=name, size=len(data), data=data))
    return files, notes


def _matching_files(out_dir: Path, pattern: str) -> Iterator[tuple[str, int, int, str]]:
    """Yield (relative name, size, dir_fd, filename) for regular files; links never followed.

    ``dir_fd`` is only valid until the next item: ``os.fwalk`` closes it as it moves on.
    """
    if out_dir.is_symlink() or not out_dir.is_dir():
        return
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(out_dir, follow_symlinks=False):
        dirnames.sort()  # a stable order for callers and tests
        for filename in sorted(filenames):
            info = os.stat(filename, dir_fd=dir_fd, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):
                continue  # symlinks, FIFOs, sockets and devices are never read
            relative = os.path.relpath(os.path.join(dirpath, filename), out_dir)
            if fnmatch.fnmatchcase(relative, pattern):
                yield relative, info.st_size, dir_fd, filename


def _read_nofollow(dir_fd: int, filename: str, size: int) -> bytes | None:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(filename, flags, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks = []
        remaining = size
        while remaining > 0 and (chunk := os.read(fd, min(remaining, 1 << 20))):
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)

"""The per-run directory: program, input files, the writable work dir and its ``out/`` files.

Layout (host side)::

    <work_root>/loopwright-sbx-XXXX/   0711, runner-owned: the sandbox uid may pass, not list
        main.py | main.js              0444, bound read-only at /code/
        passwd, group                  0444, a one-user passwd for getpwuid()/os.userInfo()
        work/                          0700, sandbox uid: bound read-write at /workdir
            out/                       files the caller collects
        tmp/                           0700, sandbox uid: TMPDIR of the rlimit-only backend

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

from skillhub.sandbox.types import (
    Language,
    OutputFile,
    SandboxRequest,
    SandboxRequestError,
    validate_relative_path,
)

SANDBOX_USER = 65534
CODE_NAMES: Mapping[Language, str] = {"python": "main.py", "node": "main.js"}
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

    @property
    def out(self) -> Path:
        return self.work / "out"


def rundir_prefix(slot: int | None) -> str:
    """Run directories of a uid slot carry its number, so a crashed run's can be found."""
    return "loopwright-sbx-" if slot is None else f"loopwright-sbx-s{slot}-"


def rundir_create(
    *,
    work_root: str,
    request: SandboxRequest,
    owner: tuple[int, int] | None,
    slot: int | None = None,
) -> RunDir:
    """Create and fill the run directory; ``owner`` (uid, gid) gets the writable parts."""
    borrowed = _borrowed_workdir(request.workdir, traversed_by_others=owner is not None)
    root = Path(tempfile.mkdtemp(prefix=rundir_prefix(slot), dir=work_root))
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
    )
    try:
        _write_readonly(rundir.code, request.code.encode())
        _write_readonly(rundir.passwd, _PASSWD.encode())
        _write_readonly(rundir.group, _GROUP.encode())
        made = (rundir.tmp,) if borrowed else (rundir.work, rundir.out, rundir.tmp)
        for directory in made:
            directory.mkdir(mode=0o700)
        for relative, content in request.files.items():
            _write_input(rundir.work, relative, content)
        if owner is not None:
            _chown_tree(rundir.work, owner)
            _chown_tree(rundir.tmp, owner)
    except BaseException:
        rundir_remove(rundir)
        raise
    return rundir


def _borrowed_workdir(workdir: str | None, *, traversed_by_others: bool) -> Path | None:
    """The caller's existing working directory, which must be a real (unlinked) directory.

    bubblewrap binds it as the sandbox uid: with a dedicated uid (``traversed_by_others``)
    every parent must be searchable by others, or the bind fails.
    """
    if workdir is None:
        return None
    if os.path.realpath(workdir) != os.path.normpath(workdir) or not os.path.isdir(workdir):
        raise SandboxRequestError(f"workdir {workdir!r} is not an existing, unlinked directory")
    path = Path(workdir)
    if traversed_by_others:
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


def _chown_tree(top: Path, owner: tuple[int, int]) -> None:
    uid, gid = owner
    os.chown(top, uid, gid)
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def rundir_remove(rundir: RunDir) -> None:
    """Delete the run directory, whatever modes the program left on what it created."""

    def unlock_and_retry(func: Callable[..., Any], failed: str, _exc: object) -> None:
        # A non-root runner cannot enter a directory the program chmod-ed to 0; root can.
        for candidate in (os.path.dirname(failed), failed):
            if os.path.isdir(candidate) and not os.path.islink(candidate):
                os.chmod(candidate, 0o700)
        func(failed)

    if sys.version_info >= (3, 12):
        shutil.rmtree(rundir.root, onexc=unlock_and_retry)
    else:  # onerror is deprecated from 3.12 on; 3.11 only has it
        shutil.rmtree(rundir.root, onerror=unlock_and_retry)
    if rundir.borrowed_owner is not None:
        # Every sandbox process is dead: hand the borrowed directory back (links unfollowed).
        _chown_tree(rundir.work, rundir.borrowed_owner)


def rundirs_remove_stale(work_root: str, slot: int) -> None:
    """Delete run directories a crashed holder of ``slot`` left behind (its processes are
    already dead: the slot was swept)."""
    for path in Path(work_root).glob(f"{rundir_prefix(slot)}*"):
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

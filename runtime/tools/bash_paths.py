"""The harness's ``paths`` section around one ``bash`` command.

Before the command the working tree is scanned once (links never followed, at most
:data:`MAX_SCAN_ENTRIES` entries):

- every existing path that ``paths.deny`` covers is *masked* inside the sandbox: a directory
  (matched itself, or wholly by ``dir/**`` / ``dir/*``) behind an empty tmpfs, so nothing in it
  is readable and whatever the command writes there disappears with the sandbox; a file behind
  ``/dev/null`` bound read-only (reads are empty, writes and deletes fail);
- the state of every entry (type, size, mtime, inode, mode) is kept.

After the command the tree is scanned again and compared:

- ``paths.deny``: a file or directory the command *created* where a deny glob matches (a new
  ``.pem``, a new ``secrets2/``) is removed; the result says so. (An existing denied path was
  masked, so the command could not change it.)
- ``paths.maxFiles``: the distinct files the command created, modified or deleted count
  against the invocation's limit, together with those its file tools already wrote. The rule
  when a command goes over: changes to files that existed (modifications, deletions) cannot be
  undone without a copy of the tree, so they are kept and counted; files the command *created*
  are kept in path order while the limit allows and the rest are removed. The result is then an
  error naming ``paths.maxFiles`` and its layer, listing what was removed.

``.git`` directories are not walked (git's object store is not what ``maxFiles`` counts; a
``paths.deny`` that names ``.git`` still masks it). A tree larger than :data:`MAX_SCAN_ENTRIES`
(or with more than :data:`MAX_MASKS` denied paths) is refused before the command runs while a
``paths`` setting is in force: the harness cannot be kept there, and running anyway would
pretend it is.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass, field

from runtime.tools.base import ToolError
from runtime.tools.workspace import PathRules, denied_below, denied_by

MAX_SCAN_ENTRIES = 100_000
MAX_MASKS = 512

#: (file type bits, size, mtime ns, inode, permission bits)
Signature = tuple[int, int, int, int, int]


@dataclass
class TreeScan:
    entries: dict[str, Signature] = field(default_factory=dict)
    mask_dirs: list[str] = field(default_factory=list)
    mask_files: list[str] = field(default_factory=list)
    complete: bool = True


def _denied(relative: str, rules: PathRules) -> bool:
    return bool(denied_by(relative, rules.deny) or denied_below(relative, rules.deny))


def scan_tree(
    root: str, rules: PathRules, *, masks: bool, skip: frozenset[str] = frozenset()
) -> TreeScan:
    """The tree's entries (not below masked directories, nor below ``skip``) and, with
    ``masks``, what to mask."""
    scan = TreeScan()
    pending = [""]
    while pending:
        directory = pending.pop()
        try:
            with os.scandir(os.path.join(root, directory) if directory else root) as it:
                children = list(it)
        except OSError:
            continue
        for child in children:
            relative = f"{directory}/{child.name}" if directory else child.name
            try:
                info = child.stat(follow_symlinks=False)
            except OSError:
                continue
            if len(scan.entries) >= MAX_SCAN_ENTRIES:
                scan.complete = False
                return scan
            kind = stat.S_IFMT(info.st_mode)
            scan.entries[relative] = (
                kind,
                info.st_size,
                info.st_mtime_ns,
                info.st_ino,
                stat.S_IMODE(info.st_mode),
            )
            denied = masks and _denied(relative, rules)
            if kind == stat.S_IFDIR:
                if denied:
                    scan.mask_dirs.append(relative)
                elif relative in skip or child.name == ".git":
                    continue  # git's own store: not the files a command writes
                else:
                    pending.append(relative)
            elif denied and kind == stat.S_IFREG:
                scan.mask_files.append(relative)
            elif denied and kind == stat.S_IFLNK:
                _mask_link_target(root, relative, scan)
    return scan


def _mask_link_target(root: str, relative: str, scan: TreeScan) -> None:
    """A denied name that is a link: mask what it points to inside the tree (a mount cannot
    sit on a link; outside the tree the sandbox has nothing to reach)."""
    real_root = os.path.realpath(root)
    target = os.path.realpath(os.path.join(root, relative))
    if not target.startswith(real_root + os.sep):
        return
    inside = os.path.relpath(target, real_root)
    if os.path.isdir(target):
        if inside not in scan.mask_dirs:
            scan.mask_dirs.append(inside)
    elif os.path.isfile(target) and inside not in scan.mask_files:
        scan.mask_files.append(inside)


def prepare(root: str, rules: PathRules, max_files: int | None) -> TreeScan | None:
    """The scan before a command, or None when no ``paths`` setting is in force."""
    if not rules.deny and max_files is None:
        return None
    scan = scan_tree(root, rules, masks=bool(rules.deny))
    if not scan.complete:
        raise ToolError(
            f"Not run: the working tree has more than {MAX_SCAN_ENTRIES:,} entries, too many "
            f"to keep the harness's paths settings ({_settings(rules, max_files)}) for a bash "
            "command. Use the file tools, or work in a smaller tree."
        )
    if len(scan.mask_dirs) + len(scan.mask_files) > MAX_MASKS:
        raise ToolError(
            f"Not run: more than {MAX_MASKS} paths of the working tree are {rules.deny_reason()}"
            "; bash cannot hide that many. Move them under one denied directory."
        )
    return scan


def _settings(rules: PathRules, max_files: int | None) -> str:
    named = []
    if rules.deny:
        named.append(f"paths.deny{rules.deny_layer}")
    if max_files is not None:
        named.append(rules.max_files_reason())
    return ", ".join(named)


@dataclass
class Enforcement:
    #: Lines appended to the command's result.
    lines: list[str] = field(default_factory=list)
    #: Workdir-relative files the command changed and that stay (counted as written).
    written: list[str] = field(default_factory=list)
    refused: bool = False


def enforce(
    root: str,
    before: TreeScan,
    rules: PathRules,
    max_files: int | None,
    already_written: set[str],
) -> Enforcement:
    """Compare the tree after the command with ``before``; undo what the settings forbid."""
    # Never below the masked directories: the command saw a tmpfs there, not their content.
    after = scan_tree(root, rules, masks=False, skip=frozenset(before.mask_dirs))
    result = Enforcement()
    if not after.complete:
        result.refused = True
        result.lines.append(
            f"paths: the command left more than {MAX_SCAN_ENTRIES:,} entries; its changes "
            "could not all be checked against the harness's paths settings."
        )
    masked = tuple(before.mask_dirs)
    created = sorted(p for p in after.entries if p not in before.entries)
    modified = sorted(
        p
        for p, sig in after.entries.items()
        if p in before.entries and before.entries[p] != sig and sig[0] != stat.S_IFDIR
    )
    deleted = sorted(
        p
        for p, sig in before.entries.items()
        if p not in after.entries and sig[0] != stat.S_IFDIR and not _under(p, masked)
    )
    removed = _remove_denied(root, created, rules) if rules.deny else []
    if removed:
        result.refused = True
        result.lines.append(
            f"paths.deny{rules.deny_layer}: removed what the command created where the harness "
            f"denies it: {', '.join(removed)}"
        )
    created = [
        p for p in created if not _under(p, tuple(removed)) and after.entries[p][0] != stat.S_IFDIR
    ]
    _apply_max_files(root, result, created, modified + deleted, rules, max_files, already_written)
    return result


def _under(path: str, tops: tuple[str, ...]) -> bool:
    return any(path == top or path.startswith(top + "/") for top in tops)


def _remove_denied(root: str, created: list[str], rules: PathRules) -> list[str]:
    removed: list[str] = []
    for relative in created:
        if _under(relative, tuple(removed)) or not _denied(relative, rules):
            continue
        _remove(os.path.join(root, relative))
        removed.append(relative)
    return removed


def _remove(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


def _apply_max_files(
    root: str,
    result: Enforcement,
    created: list[str],
    changed: list[str],
    rules: PathRules,
    max_files: int | None,
    already_written: set[str],
) -> None:
    fixed = [p for p in changed if p not in already_written]
    new = [p for p in created if p not in already_written]
    result.written = [p for p in (*changed, *created) if p in already_written]
    if max_files is None:
        result.written += fixed + new
        return
    room = max_files - len(already_written) - len(fixed)
    kept = new[: max(room, 0)]
    dropped = new[len(kept) :]
    result.written += fixed + kept
    for relative in dropped:
        _remove(os.path.join(root, relative))
    over = len(already_written) + len(fixed) > max_files
    if dropped or over:
        result.refused = True
        total = len(already_written) + len(fixed) + len(kept)
        line = f"refused by {rules.max_files_reason()}: this invocation has now written {total}"
        if dropped:
            line += f"; removed the files the command created beyond it: {', '.join(dropped)}"
        if over:
            line += (
                f"; changes to existing files cannot be undone and were kept: {', '.join(fixed)}"
            )
        result.lines.append(line)

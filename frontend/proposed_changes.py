"""What a gated ``write`` or ``edit`` would change: a diff against the file as it is now.

The file is read from the run's working directory through the file tools' own resolution
(``runtime.tools.workspace.Workspace``: nothing outside the workspace, no symlink out, the
default deny patterns such as ``.env`` refused), at most :data:`MAX_BYTES`. Where it cannot be
read (another host's disk, a denied path, not text) the change is described without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from frontend.diffs import DiffLine, text_diff
from runtime.tools.base import ToolError
from runtime.tools.workspace import DEFAULT_DENY_PATTERNS, Workspace

MAX_BYTES = 512 * 1024
FILE_TOOLS = ("write", "edit")


@dataclass(frozen=True)
class ProposedChange:
    path: str
    lines: list[DiffLine] = field(default_factory=list)
    note: str = ""  # why there is no diff, or what the diff is against


def _current(workdir: str | None, path: str) -> tuple[str | None, str]:
    """The file's text now (None when it does not exist), or a note saying why not read."""
    if not workdir:
        return None, "the run has no workspace to compare with"
    try:
        workspace = Workspace(workdir, DEFAULT_DENY_PATTERNS)
        target = workspace.resolve(path)
        if not target.real.exists():
            return None, "a new file"
        data, size = workspace.read_bytes(target, MAX_BYTES)
    except ToolError as exc:
        return None, f"the current file cannot be shown: {exc}"
    if size > MAX_BYTES:
        return None, f"the current file is larger than {MAX_BYTES // 1024} KiB"
    try:
        return data.decode("utf-8"), ""
    except UnicodeDecodeError:
        return None, "the current file is not UTF-8 text"


def proposed_change(
    tool: str, arguments: dict[str, Any], workdir: str | None
) -> ProposedChange | None:
    """The diff a gated file tool call would make; None for other tools or odd arguments."""
    path = arguments.get("path")
    if tool not in FILE_TOOLS or not isinstance(path, str) or not path:
        return None
    current, note = _current(workdir, path)
    if tool == "write":
        content = arguments.get("content")
        if not isinstance(content, str):
            return None
        old_label = "/dev/null" if current is None and note == "a new file" else f"a/{path}"
        lines = text_diff(current or "", content, old_label, f"b/{path}")
        return ProposedChange(path, lines, note if current is None else "")
    old, new = arguments.get("old_text"), arguments.get("new_text")
    if not isinstance(old, str) or not isinstance(new, str):
        return None
    if current is None or old not in current:
        # Without the file, the replacement itself is the change.
        why = note or "old_text is not in the current file (the edit would fail)"
        return ProposedChange(path, text_diff(old, new, f"a/{path}", f"b/{path}"), why)
    updated = (
        current.replace(old, new) if arguments.get("replace_all") else current.replace(old, new, 1)
    )
    return ProposedChange(path, text_diff(current, updated, f"a/{path}", f"b/{path}"))

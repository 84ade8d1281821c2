"""Builtin file tools: ``read``, ``list`` (effect read), ``write``, ``edit`` (effect write).

All four are confined to the invocation's working directory (see :mod:`.workspace`) and refuse
paths that match the registry's deny patterns or the harness's ``paths.deny`` (read from the
calling invocation's compiled settings, ``ToolContext.invocation.harness``); ``list`` leaves
such entries out. ``write`` and ``edit`` also count the distinct files written in the
invocation against the lower of ``max_files`` and the harness's ``paths.maxFiles`` (the
refusal names the setting and its layer when the harness value binds) and record each effect
in the ledger
under the call's idempotency key (see :mod:`.ledger`). Blocking file I/O runs in a thread so a
slow disk never stalls the other calls of the step.
"""

from __future__ import annotations

import abc
import asyncio
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.tools.base import Tool, ToolContext, ToolError, ToolResult
from runtime.tools.ledger import EffectLedger, LedgerEntry, MemoryLedger, digest
from runtime.tools.registry import ToolRegistry
from runtime.tools.workspace import (
    DEFAULT_DENY_PATTERNS,
    PathRules,
    PathTarget,
    Workspace,
)
from runtime.types import Effect, ToolSpec

_BINARY_PROBE_BYTES = 8192
#: Guards ``ToolContext.files_written``: calls of one step run in parallel threads.
_RESERVE_LOCK = threading.Lock()


@dataclass(frozen=True)
class FileToolConfig:
    deny_patterns: tuple[str, ...] = DEFAULT_DENY_PATTERNS
    #: Distinct files one invocation may write (``maxFiles``); None means no limit.
    max_files: int | None = None
    max_read_bytes: int = 10 * 1024 * 1024
    max_list_entries: int = 1000
    ledger: EffectLedger = field(default_factory=MemoryLedger)


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


_PATH = {"type": "string", "description": "Path relative to the working directory."}


class _FileTool(abc.ABC):
    spec: ToolSpec

    def __init__(self, config: FileToolConfig) -> None:
        self.config = config

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        return await asyncio.to_thread(self._run, arguments, context)

    def _run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        rules = PathRules.of(context.invocation)
        workspace = Workspace(context.workdir, self.config.deny_patterns, rules)
        return self.execute(workspace, arguments, context)

    @abc.abstractmethod
    def execute(
        self, workspace: Workspace, arguments: dict[str, Any], context: ToolContext
    ) -> ToolResult: ...


class ReadTool(_FileTool):
    spec = ToolSpec(
        name="read",
        description=(
            "Read a UTF-8 text file in the working directory. Use offset and limit (in lines, "
            "offset starting at 1) to read part of a large file."
        ),
        parameters=_schema(
            {
                "path": _PATH,
                "offset": {"type": "integer", "minimum": 1},
                "limit": {"type": "integer", "minimum": 1},
            },
            ["path"],
        ),
        effect=Effect.READ,
        needs_workdir=True,
    )

    def execute(
        self, workspace: Workspace, arguments: dict[str, Any], context: ToolContext
    ) -> ToolResult:
        target = workspace.resolve(arguments["path"])
        data, size = workspace.read_bytes(target, self.config.max_read_bytes)
        if b"\x00" in data[:_BINARY_PROBE_BYTES]:
            raise ToolError(
                f"{target.given!r} looks like a binary file ({size:,} bytes); "
                "only text files can be read."
            )
        text = data.decode("utf-8", errors="replace")
        if "offset" in arguments or "limit" in arguments:
            text = _line_window(text, arguments.get("offset", 1), arguments.get("limit"))
        if size > len(data):
            text += f"\n[file is {size:,} bytes; only the first {len(data):,} were read]"
        return ToolResult(text if text else "[empty file]")


def _line_window(text: str, offset: int, limit: int | None) -> str:
    lines = text.splitlines(keepends=True)
    chosen = lines[offset - 1 : offset - 1 + limit if limit else None]
    if not chosen:
        return f"[the file has {len(lines)} lines; offset {offset} is past the end]"
    last = offset + len(chosen) - 1
    return f"[lines {offset}-{last} of {len(lines)}]\n" + "".join(chosen)


class ListTool(_FileTool):
    spec = ToolSpec(
        name="list",
        description=(
            "List a directory in the working directory (directories end with '/'). Set "
            "recursive to list everything below it."
        ),
        parameters=_schema(
            {"path": {**_PATH, "default": "."}, "recursive": {"type": "boolean", "default": False}},
            [],
        ),
        effect=Effect.READ,
        needs_workdir=True,
    )

    def execute(
        self, workspace: Workspace, arguments: dict[str, Any], context: ToolContext
    ) -> ToolResult:
        target = workspace.resolve(arguments.get("path") or ".")
        if not target.real.is_dir():
            raise ToolError(f"{target.given!r} is not a directory; use the read tool for files.")
        limit = self.config.max_list_entries
        entries: list[str] = []
        for entry in _walk(workspace, target.real, bool(arguments.get("recursive")), context):
            if len(entries) == limit:
                entries.append(f"[stopped after {limit} entries; list a subdirectory]")
                break
            entries.append(entry)
        return ToolResult("\n".join(entries) if entries else "[empty directory]")


def _walk(workspace: Workspace, top: Path, recursive: bool, context: ToolContext) -> Iterator[str]:
    pending = [top]
    while pending:
        context.check()
        directory = pending.pop(0)
        try:
            with os.scandir(directory) as scan:
                children = sorted(scan, key=lambda e: e.name)
        except OSError as exc:
            shown = directory.relative_to(workspace.root).as_posix()
            yield f"{shown}/ [cannot be listed: {exc.strerror}]"
            continue
        for child in children:
            relative = Path(child.path).relative_to(workspace.root).as_posix()
            if workspace.hidden(relative):
                continue
            shown = Path(child.path).relative_to(top).as_posix()
            if child.is_symlink():
                yield f"{shown} (symlink)"
            elif child.is_dir():
                yield f"{shown}/"
                if recursive:
                    pending.append(Path(child.path))
            else:
                yield shown


class _FileWriter(_FileTool):
    """A tool that replaces one file's content, once per idempotency key."""

    def execute(
        self, workspace: Workspace, arguments: dict[str, Any], context: ToolContext
    ) -> ToolResult:
        target = workspace.resolve(arguments["path"])
        done = _already_applied(workspace, target, context, self.config)
        if done:
            return done
        data, message = self.new_content(workspace, target, arguments)
        return _commit(workspace, target, data, context, self.config, message)

    @abc.abstractmethod
    def new_content(
        self, workspace: Workspace, target: PathTarget, arguments: dict[str, Any]
    ) -> tuple[bytes, str]:
        """The file's new content and the message that reports the change."""


class WriteTool(_FileWriter):
    spec = ToolSpec(
        name="write",
        description=(
            "Create or overwrite a text file in the working directory with the given content "
            "(parent directories are created)."
        ),
        parameters=_schema({"path": _PATH, "content": {"type": "string"}}, ["path", "content"]),
        effect=Effect.WRITE,
        needs_workdir=True,
    )

    def new_content(
        self, workspace: Workspace, target: PathTarget, arguments: dict[str, Any]
    ) -> tuple[bytes, str]:
        data = arguments["content"].encode("utf-8")
        return data, f"Wrote {len(data):,} bytes to {target.relative}."


class EditTool(_FileWriter):
    spec = ToolSpec(
        name="edit",
        description=(
            "Replace an exact piece of text in a file. old_text must match the file exactly "
            "(whitespace included) and occur once, unless replace_all is true."
        ),
        parameters=_schema(
            {
                "path": _PATH,
                "old_text": {"type": "string", "minLength": 1},
                "new_text": {"type": "string"},
                "replace_all": {"type": "boolean", "default": False},
            },
            ["path", "old_text", "new_text"],
        ),
        effect=Effect.WRITE,
        needs_workdir=True,
    )

    def new_content(
        self, workspace: Workspace, target: PathTarget, arguments: dict[str, Any]
    ) -> tuple[bytes, str]:
        text = _read_for_edit(workspace, target, self.config.max_read_bytes)
        old, new = _locate(text, arguments["old_text"], arguments["new_text"], target)
        count = text.count(old)
        replace_all = bool(arguments.get("replace_all"))
        if count > 1 and not replace_all:
            raise ToolError(
                f"old_text occurs {count} times in {target.given!r}. Include more surrounding "
                "lines so it matches exactly once, or set replace_all to true."
            )
        updated = text.replace(old, new) if replace_all else text.replace(old, new, 1)
        replaced = count if replace_all else 1
        return updated.encode("utf-8"), f"Replaced {replaced} occurrence(s) in {target.relative}."


def _read_for_edit(workspace: Workspace, target: PathTarget, max_bytes: int) -> str:
    data, size = workspace.read_bytes(target, max_bytes)
    if size > len(data):
        raise ToolError(f"{target.given!r} is {size:,} bytes, too large to edit here.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{target.given!r} is not UTF-8 text, so it cannot be edited.") from None


def _locate(text: str, old: str, new: str, target: PathTarget) -> tuple[str, str]:
    """The text to replace as it is in the file (repairing LF vs CRLF line endings)."""
    if old in text:
        return old, new
    if "\r\n" in text and "\n" in old and old.replace("\n", "\r\n") in text:
        return old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
    hint = (
        " It does occur with different surrounding whitespace."
        if old.strip() and old.strip() in text
        else ""
    )
    raise ToolError(
        f"old_text was not found in {target.given!r}.{hint} Read the file and copy the exact "
        "text to replace, including whitespace and indentation."
    )


def _already_applied(
    workspace: Workspace, target: PathTarget, context: ToolContext, config: FileToolConfig
) -> ToolResult | None:
    """The earlier result when this very call (same idempotency key) already took effect."""
    entry = config.ledger.get(context.idempotency_key)
    if entry is None or entry.path != target.relative or not target.real.is_file():
        return None
    data, size = workspace.read_bytes(target, config.max_read_bytes)
    if size != len(data) or digest(data) != entry.digest:
        return None
    _reserve(context, target.relative, None)
    return ToolResult(f"{entry.message} (already applied)", files_written=(target.relative,))


def max_files_limit(config_max: int | None, rules: PathRules) -> tuple[int | None, str]:
    """The binding ``maxFiles`` of a call (the lower of the tool's and the harness's) and how
    a refusal names it."""
    harness = rules.max_files
    if harness is not None and (config_max is None or harness <= config_max):
        return harness, f"refused by {rules.max_files_reason()}"
    return config_max, "refused"


def _reserve(
    context: ToolContext, relative: str, max_files: int | None, why: str = "refused"
) -> bool:
    """Count ``relative`` as written; False when it was counted already."""
    with _RESERVE_LOCK:
        if relative in context.files_written:
            return False
        if max_files is not None and len(context.files_written) >= max_files:
            written = ", ".join(sorted(context.files_written)) or "none yet"
            raise ToolError(
                f"Not written ({why}): this invocation may write at most {max_files} distinct "
                f"files and has written {written}. Change one of those files or finish."
            )
        context.files_written.add(relative)
        return True


def _commit(
    workspace: Workspace,
    target: PathTarget,
    data: bytes,
    context: ToolContext,
    config: FileToolConfig,
    message: str,
) -> ToolResult:
    context.check()
    limit, why = max_files_limit(config.max_files, workspace.rules)
    newly_counted = _reserve(context, target.relative, limit, why)
    try:
        # The ledger entry goes first: a crash after the rename must find it on the re-issue.
        config.ledger.put(
            context.idempotency_key, LedgerEntry(target.relative, digest(data), message)
        )
        workspace.write_bytes(target, data)
    except BaseException:
        if newly_counted:
            with _RESERVE_LOCK:
                context.files_written.discard(target.relative)
        raise
    return ToolResult(message, files_written=(target.relative,))


def builtin_file_tools(config: FileToolConfig | None = None) -> list[Tool]:
    config = config or FileToolConfig()
    return [ReadTool(config), ListTool(config), WriteTool(config), EditTool(config)]


def builtin_registry(config: FileToolConfig | None = None) -> ToolRegistry:
    """A registry holding the builtin file tools (``bash`` comes later, through the sandbox)."""
    return ToolRegistry(builtin_file_tools(config))

"""Prompts rendered with instructions, run inputs and workspace files (docs/prompts.md).

``pins_for`` fixes, when a run starts, the version of every instruction its texts reference
without a version (the latest published); ``render`` renders a text with those pins, so a run
that resumes after a new version is published keeps the text it started with. Published
versions never change, so their texts are cached in the process for good.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from instructions.services import InstructionNotFound, instruction_text
from orchestrator.dbthreads import OffLoopDb
from runtime.prompt_template import (
    IncludeReader,
    PromptTemplateError,
    RenderedPrompt,
    has_placeholders,
    instruction_references,
    render_prompt,
)
from runtime.tools import DEFAULT_DENY_PATTERNS
from runtime.tools.base import ToolError
from runtime.tools.workspace import Workspace

#: The largest workspace file ``${include()}`` reads.
MAX_INCLUDE_BYTES = 256 * 1024
_THREADS = OffLoopDb("prompt-render")
_lock = threading.Lock()
_published: dict[tuple[str, int], str] = {}


def published_text(name: str, version: int | None) -> tuple[str, int]:
    """``instruction_text``, from the process cache for a given version; a missing one is a
    :class:`PromptTemplateError` naming the reference."""
    if version is not None:
        with _lock:
            cached = _published.get((name, version))
        if cached is not None:
            return cached, version
    try:
        text, number = instruction_text(name, version)
    except InstructionNotFound as exc:
        raise PromptTemplateError(str(exc.detail)) from exc
    with _lock:
        _published[(name, number)] = text
    return text, number


def pins_for(texts: Iterable[str]) -> dict[str, int]:
    """``{name: latest published version}`` of every instruction ``texts`` reference without a
    version; a missing or unpublished one (versioned or not) is a PromptTemplateError."""
    pins: dict[str, int] = {}
    for text in texts:
        for name, version in instruction_references(text):
            if version is not None:
                published_text(name, version)
            elif name not in pins:
                pins[name] = published_text(name, None)[1]
    return pins


def workspace_include(workdir: str | None) -> IncludeReader | None:
    """A reader of the run's workspace files for ``${include()}`` (the file tools' containment
    and default deny patterns, UTF-8, at most ``MAX_INCLUDE_BYTES``); None without one."""
    if not workdir:
        return None

    def read(path: str) -> str:
        shown = f'${{include("{path}")}}'
        try:
            workspace = Workspace(workdir, DEFAULT_DENY_PATTERNS)
            target = workspace.resolve(path)
            if not target.real.is_file():
                raise PromptTemplateError(f"{shown}: no such file in the run's workspace")
            data, size = workspace.read_bytes(target, MAX_INCLUDE_BYTES)
        except ToolError as exc:
            raise PromptTemplateError(f"{shown}: {exc}") from exc
        except OSError as exc:
            raise PromptTemplateError(f"{shown}: {exc.strerror or exc}") from exc
        if size > MAX_INCLUDE_BYTES:
            raise PromptTemplateError(
                f"{shown}: the file is {size:,} bytes; at most {MAX_INCLUDE_BYTES:,} are included"
            )
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PromptTemplateError(f"{shown}: the file is not UTF-8 text") from exc

    return read


def render_here(
    text: str,
    *,
    inputs: Mapping[str, Any] | None = None,
    pins: Mapping[str, int] | None = None,
    workdir: str | None = None,
) -> RenderedPrompt:
    """``text`` rendered on this thread (one that may use the database)."""
    return render_prompt(
        text,
        variables=inputs,
        instruction=published_text,
        include=workspace_include(workdir),
        pinned=pins,
    )


def _all_cached(text: str, pins: Mapping[str, int]) -> bool:
    with _lock:
        return all(
            (name, version if version is not None else pins.get(name, -1)) in _published
            for name, version in instruction_references(text)
        )


async def render(
    text: str,
    *,
    inputs: Mapping[str, Any] | None = None,
    pins: Mapping[str, int] | None = None,
    workdir: str | None = None,
) -> RenderedPrompt:
    """:func:`render_here` from an event loop: inline when no instruction text must be read
    from the database, else on a database thread."""
    if not has_placeholders(text):
        return RenderedPrompt(text)
    if _all_cached(text, pins or {}):
        return render_here(text, inputs=inputs, pins=pins, workdir=workdir)
    return await _THREADS.run(lambda: render_here(text, inputs=inputs, pins=pins, workdir=workdir))

"""Readable diffs: two JSON documents (pretty-printed with sorted keys), or two texts. Pure."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DiffLine:
    kind: str  # "file", "hunk", "add", "del" or "ctx"
    text: str


def _lines(document: Any) -> list[str]:
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False).splitlines()


def _kind(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "file"
    if line.startswith("@@"):
        return "hunk"
    return {"+": "add", "-": "del"}.get(line[:1], "ctx")


def json_diff(
    old: Any, new: Any, old_label: str, new_label: str, context: int = 3
) -> list[DiffLine]:
    """Unified diff lines; empty when the documents are equal."""
    diff = difflib.unified_diff(
        _lines(old), _lines(new), fromfile=old_label, tofile=new_label, lineterm="", n=context
    )
    return [DiffLine(_kind(line), line) for line in diff]


def text_diff(
    old: str, new: str, old_label: str, new_label: str, context: int = 3
) -> list[DiffLine]:
    """Unified diff lines of two texts; empty when they are equal."""
    diff = difflib.unified_diff(
        old.splitlines(), new.splitlines(), fromfile=old_label, tofile=new_label, lineterm="",
        n=context,
    )  # fmt: skip
    return [DiffLine(_kind(line), line) for line in diff]

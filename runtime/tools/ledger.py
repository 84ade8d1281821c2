"""An effect ledger: makes a file write happen once per idempotency key.

The crash window it closes: a write tool replaced the file, then the worker died before the
journal recorded the result. On resume the call is re-issued with the same idempotency key. For
``write`` doing it again is harmless, but an ``edit`` would now fail (its old text is gone) or,
worse, apply twice. So before a tool replaces a file it records ``key → (path, digest of the new
content)``; a re-issue that finds its key with the file already holding that digest reports the
earlier success instead of writing again. A record without the matching content (the crash came
before the rename) lets the write go ahead normally.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class LedgerEntry:
    path: str
    digest: str
    message: str


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class EffectLedger(Protocol):
    def get(self, key: str) -> LedgerEntry | None: ...

    def put(self, key: str, entry: LedgerEntry) -> None: ...


class MemoryLedger:
    """Per-process ledger: covers re-issues in the same process only (tests, development)."""

    def __init__(self) -> None:
        self._entries: dict[str, LedgerEntry] = {}

    def get(self, key: str) -> LedgerEntry | None:
        return self._entries.get(key)

    def put(self, key: str, entry: LedgerEntry) -> None:
        self._entries[key] = entry


class DirectoryLedger:
    """One small JSON file per key in a directory, written atomically and fsynced.

    Survives a worker crash; put it on the same machine (and lifetime) as the worktrees.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def _path(self, key: str) -> Path:
        return self.directory / f"{hashlib.sha256(key.encode()).hexdigest()}.json"

    def get(self, key: str) -> LedgerEntry | None:
        try:
            data = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return None
        return LedgerEntry(path=data["path"], digest=data["digest"], message=data["message"])

    def put(self, key: str, entry: LedgerEntry) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        payload = {"key": key, **entry.__dict__}
        fd, temporary = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self._path(key))

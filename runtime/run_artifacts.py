"""Files a tool brings back for a run (a remote agent's file parts), kept as the run's artifacts.

The run engine registers the store (``loops.apps``); where none is registered (a chat request,
which has no run) a file is only described to the model. Storing is idempotent per ``source``:
a re-issued call that brings the same file back stores it once.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

#: The largest file kept as an artifact; a larger one is described, not stored.
MAX_FILE_BYTES = 5 * 1024 * 1024


@dataclass(frozen=True)
class ToolFile:
    """One file: its bytes, or the URL the agent named for it."""

    name: str
    media_type: str
    content: bytes | None = None
    url: str = ""


#: ``(run id, source, file) -> artifact id``; blocking (it writes the database).
Store = Callable[[uuid.UUID, str, ToolFile], str]
_store: Store | None = None


def run_artifact_store_register(store: Store) -> None:
    """Install the engine's store."""
    global _store
    _store = store


def store_run_artifact(run_id: uuid.UUID, source: str, file: ToolFile) -> str | None:
    """Keep ``file`` as an artifact of run ``run_id`` (blocking); its id, or None when no store
    is registered or the file is too large."""
    if _store is None or (file.content is not None and len(file.content) > MAX_FILE_BYTES):
        return None
    return _store(run_id, source, file)

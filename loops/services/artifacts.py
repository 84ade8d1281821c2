"""A run's artifacts: those tools bring back (``runtime.run_artifacts``: one row per file and
source, so a re-issued call stores its files once), and the list a verification reads."""

from __future__ import annotations

import base64
import uuid
from typing import Any

from django.db import transaction

from loops.models import LoopArtifact, LoopRun
from orchestrator.sql import fetch_all_prepared, is_postgres
from runtime.run_artifacts import ToolFile

#: The artifact ``kind`` of a file a tool brought back.
TOOL_FILE = "tool-file"
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/yaml")


_RUN_ARTIFACTS_SQL = (
    "SELECT id, kind, name FROM loops_loopartifact WHERE run_id = %s ORDER BY created_at, id"
)


def run_artifacts(run_id: uuid.UUID) -> list[dict[str, Any]]:
    """The run's artifacts as ``{"id", "kind", "name"}`` (ids as UUIDs), oldest first. On
    PostgreSQL one prepared read (every verification reads them twice)."""
    if is_postgres():
        rows = fetch_all_prepared("lw_run_artifacts", _RUN_ARTIFACTS_SQL, [run_id])
        return [{"id": i, "kind": k, "name": n} for i, k, n in rows]
    found = LoopArtifact.objects.filter(run_id=run_id).order_by("created_at", "id")
    return [dict(row) for row in found.values("id", "kind", "name")]


def _encoded(file: ToolFile) -> tuple[str, str]:
    """``(content, encoding)``: text as UTF-8 when its type is textual and it decodes, else
    base64; a file known only by its URL has no content."""
    if file.content is None:
        return "", "url"
    if file.media_type.startswith(_TEXT_TYPES):
        try:
            return file.content.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            pass
    return base64.b64encode(file.content).decode("ascii"), "base64"


@transaction.atomic
def artifact_store_tool_file(run_id: uuid.UUID, source: str, file: ToolFile) -> str:
    """Keep ``file`` as an artifact of the run (once per ``source``); the artifact's id."""
    LoopRun.objects.select_for_update().only("id").get(pk=run_id)  # one writer per run
    found = LoopArtifact.objects.filter(
        run_id=run_id, kind=TOOL_FILE, metadata__source=source
    ).first()
    if found is not None:
        return str(found.id)
    content, encoding = _encoded(file)
    artifact = LoopArtifact.objects.create(
        run_id=run_id,
        kind=TOOL_FILE,
        name=file.name[:200] or "unnamed",
        content_type=(file.media_type or "application/octet-stream")[:100],
        content=content,
        metadata={
            "source": source,
            "encoding": encoding,
            "size": len(file.content) if file.content is not None else None,
            "url": file.url,
        },
    )
    return str(artifact.id)

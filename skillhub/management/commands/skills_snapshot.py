"""``manage.py skills_snapshot export <file> [--tool-name NAME ...]`` and ``manage.py
skills_snapshot import <file> [--replace] [--dry-run]`` (docs/skills.md, Snapshots)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from orchestrator.errors import DomainError
from skillhub.services.snapshot_format import SNAPSHOT_MAX_BYTES
from skillhub.services.snapshots import snapshot_export, snapshot_import


def _problem(exc: DomainError) -> CommandError:
    """The refusal with every field it names (``/skills/0/input_schema: ...``)."""
    lines = [exc.detail]
    errors = exc.extra.get("errors", [])
    lines += [f"  {e.get('pointer') or '/'}: {e.get('detail')}" for e in errors]
    return CommandError("\n".join(lines))


class Command(BaseCommand):
    help = "Export the Skill Hub's skills as a snapshot zip, or import one."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        export = sub.add_parser("export", help="write every skill (or those named) to <file>")
        export.add_argument("file", help="the zip to write")
        export.add_argument(
            "--tool-name", action="append", default=[], help="export only this skill (repeatable)"
        )
        imp = sub.add_parser("import", help="create or update skills from a snapshot <file>")
        imp.add_argument("file", help="the snapshot zip to read")
        imp.add_argument(
            "--replace", action="store_true", help="overwrite local skills that differ"
        )
        imp.add_argument("--dry-run", action="store_true", help="report only, write nothing")
        imp.add_argument("--actor", default="skills-snapshot", help="recorded as created_by")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["action"] == "export":
                self._export(Path(options["file"]), options["tool_name"])
            else:
                self._import(Path(options["file"]), options)
        except DomainError as exc:
            raise _problem(exc) from exc

    def _export(self, target: Path, tool_names: list[str]) -> None:
        export = snapshot_export(tool_names=tool_names or None)
        try:
            target.write_bytes(export.data)
        except OSError as exc:
            raise CommandError(f"file: cannot write {target}: {exc.strerror}") from exc
        self.stdout.write(
            f"{target}: {len(export.tool_names)} skills, manifest sha256 {export.manifest_sha256}"
        )

    def _import(self, source: Path, options: dict[str, Any]) -> None:
        try:
            with source.open("rb") as handle:
                data = handle.read(SNAPSHOT_MAX_BYTES + 1)
        except OSError as exc:
            raise CommandError(f"file: cannot read {source}: {exc.strerror}") from exc
        report = snapshot_import(
            data=data, actor=options["actor"], replace=options["replace"],
            dry_run=options["dry_run"],
        )  # fmt: skip
        self.stdout.write(json.dumps(report.as_dict(), indent=2))

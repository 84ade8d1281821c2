"""The folders and limits the README documents as environment variables reach the settings the
code reads (a documented variable that nothing reads would change nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_sync_roots_and_the_document_limit_come_from_the_environment(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "orchestrator.settings",
        "LOOPWRIGHT_VAR_DIR": str(tmp_path / "var"),
        "LOOPWRIGHT_KNOWLEDGE_ROOT": str(tmp_path / "kb"),
        "LOOPWRIGHT_SKILLS_ROOT": str(tmp_path / "skills"),
        "LOOPWRIGHT_KNOWLEDGE_MAX_DOCUMENT_BYTES": "12345",
    }
    script = (
        "import django, json; django.setup()\n"
        "from knowledge.services import max_document_bytes\n"
        "from knowledge.sync import knowledge_root\n"
        "from skillhub.services.directories import skills_root\n"
        "print(json.dumps([str(knowledge_root()), str(skills_root()), max_document_bytes()]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
        check=True, timeout=60,
    )  # fmt: skip
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        str(tmp_path / "kb"), str(tmp_path / "skills"), 12345,
    ]  # fmt: skip

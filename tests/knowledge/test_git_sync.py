"""A knowledge base synced from a folder of a Git repository this test creates and serves over
git's HTTP protocol on loopback: supported files become documents named by their path in the
folder (PDF included), a later commit updates and removes, files outside the folder are left
alone, and a refused repository or a path outside it is a 400 problem. The guard's own rules
(schemes, hosts, addresses) are tested once, for Skill Hub imports, in tests/security."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from knowledge.models import KnowledgeDocument
from tests.knowledge.test_api import URL, make, problem
from tests.support.git_server import GitHttpServer, git
from tests.support.pdf import text_pdf

pytestmark = pytest.mark.django_db


@pytest.fixture
def served(tmp_path: Path, settings: Any) -> Iterator[tuple[Path, GitHttpServer]]:
    settings.LOOPWRIGHT_OUTBOUND = {
        **settings.LOOPWRIGHT_OUTBOUND, "GIT_SCHEMES": frozenset({"http", "https"})
    }  # fmt: skip
    work = tmp_path / "handbook-repo"
    (work / "docs" / "hr").mkdir(parents=True)
    (work / "docs" / "hr" / "leave.md").write_text("# Leave\n\nThirty days of paid leave.")
    (work / "docs" / "expenses.pdf").write_bytes(text_pdf([["Expenses are paid monthly."]]))
    (work / "docs" / "logo.png").write_bytes(b"\x89PNG")
    (work / "README.md").write_text("Not in the synced folder.")
    git(work, "init", "--quiet", "-b", "main")
    git(work, "add", ".")
    git(work, "commit", "--quiet", "-m", "handbook")
    (tmp_path / "served").mkdir()
    with GitHttpServer(tmp_path / "served") as server:
        yield work, server


def test_a_git_folder_syncs_updates_and_removes(
    operator_client: APIClient, viewer_client: APIClient, served: tuple[Path, GitHttpServer]
) -> None:
    work, server = served
    url = server.publish(work, "handbook")
    make(operator_client)
    sync = f"{URL}/handbook/git-sync"
    first = operator_client.post(sync, {"repository": url, "path": "docs"}, format="json")
    assert first.status_code == 200, first.content
    report = first.json()
    assert report["added"] == ["expenses.pdf", "hr/leave.md"]
    assert report["commit"] == git(work, "rev-parse", "HEAD") and report["folder"] == "docs"
    assert KnowledgeDocument.objects.get(name="hr/leave.md").source == f"git:{url}#docs"
    found = viewer_client.post(f"{URL}/handbook/search", {"query": "expenses paid"}, format="json")
    assert found.json()["hits"][0]["document"] == "expenses.pdf"

    (work / "docs" / "hr" / "leave.md").write_text("# Leave\n\nTwenty-five days of paid leave.")
    (work / "docs" / "expenses.pdf").unlink()
    git(work, "commit", "--quiet", "-am", "leave changes, expenses gone")
    server.publish(work, "handbook")
    second = operator_client.post(sync, {"repository": url, "path": "docs"}, format="json").json()
    assert (second["updated"], second["removed"]) == (["hr/leave.md"], ["expenses.pdf"])
    assert "Twenty-five" in KnowledgeDocument.objects.get().chunks.get().text

    problem(viewer_client.post(sync, {"repository": url}, format="json"), 403)
    refused = problem(operator_client.post(sync, {"repository": url, "path": "../x"},
                                           format="json"), 400)  # fmt: skip
    assert refused["errors"][0]["pointer"] == "/path"
    missing = problem(operator_client.post(sync, {"repository": url, "path": "nope"},
                                           format="json"), 400)  # fmt: skip
    assert "nope is not a folder" in missing["detail"]
    local = problem(operator_client.post(sync, {"repository": str(work)}, format="json"), 400)
    assert local["type"].endswith("git-import-error")

"""``/api/v1/knowledge-bases`` and ``/api/v1/retrievals``: viewers read, operators write;
strict bodies and problem+json refusals; uploads (JSON and multipart), PDF refused (415), an
oversized document refused (413), folder sync under the knowledge root only, a person's test
search recorded, and the access matrix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import override_settings
from rest_framework.test import APIClient

from knowledge.models import KnowledgeAccess, KnowledgeBase, KnowledgeDocument, Retrieval
from tests.knowledge.kb_support import employee
from tests.support.pdf import text_pdf

pytestmark = pytest.mark.django_db
URL = "/api/v1/knowledge-bases"
PROBLEM = "application/problem+json"
LEAVE = "# Leave\n\nEmployees take thirty days of paid leave a year."


def problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == PROBLEM
    body: dict[str, Any] = response.json()
    return body


def make(client: APIClient, key: str = "handbook", **fields: Any) -> dict[str, Any]:
    response = client.post(URL, {"key": key, "name": key.title(), **fields}, format="json")
    assert response.status_code == 201, response.content
    body: dict[str, Any] = response.json()
    return body


def test_crud_by_role(operator_client: APIClient, viewer_client: APIClient) -> None:
    created = make(operator_client, description="HR rules")
    assert created["kind"] == "local" and created["document_count"] == 0
    assert created["embedded_model"] == "" and created["api_key_configured"] is False
    problem(viewer_client.post(URL, {"key": "x", "name": "X"}, format="json"), 403)
    assert [b["key"] for b in viewer_client.get(URL).json()["results"]] == ["handbook"]
    changed = operator_client.patch(f"{URL}/handbook", {"description": "new"}, format="json")
    assert changed.status_code == 200 and changed.json()["description"] == "new"
    problem(operator_client.patch(f"{URL}/handbook", {"key": "other"}, format="json"), 400)
    problem(viewer_client.delete(f"{URL}/handbook"), 403)
    assert operator_client.delete(f"{URL}/handbook").status_code == 204
    problem(viewer_client.get(f"{URL}/handbook"), 404)


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({"key": "Bad Key", "name": "x"}, "/key"),
        ({"key": "ok", "name": "x", "colour": "red"}, "/colour"),
        ({"key": "ok", "name": "x", "top_k": "many"}, "/top_k"),
        ({"key": "ok", "name": "x", "kind": "external_rag"}, "/provider"),
        ({"key": "ok", "name": "x", "kind": "external_rag", "provider": "external-http"}, "/api_url"),
        ({"key": "ok", "name": "x", "api_key_env": "DATABASE_URL"}, "/api_key_env"),
        ({"key": "ok", "name": "x", "embedding_key_env": "SECRET_KEY"}, "/embedding_key_env"),
        ({"key": "ok", "name": "x", "embedding_url": "http://127.0.0.1:9/v1"}, "/embedding_model"),
        ({"key": "ok", "name": "x", "embedding_url": "file:///etc/passwd", "embedding_model": "m"},
         "/embedding_url"),
    ],
)  # fmt: skip
def test_strict_bodies(operator_client: APIClient, body: dict[str, Any], pointer: str) -> None:
    refused = problem(operator_client.post(URL, body, format="json"), 400)
    assert pointer in [error["pointer"] for error in refused["errors"]]


def test_uploads_json_and_multipart(operator_client: APIClient, viewer_client: APIClient) -> None:
    make(operator_client)
    docs = f"{URL}/handbook/documents"
    first = operator_client.post(docs, {"name": "leave.md", "content": LEAVE}, format="json")
    assert first.status_code == 201
    body = first.json()
    assert (
        body["changed"]
        and body["chunks"] == 1
        and body["document"]["content_type"] == "text/markdown"
    )
    again = operator_client.post(docs, {"name": "leave.md", "content": LEAVE}, format="json")
    assert again.status_code == 200 and again.json()["changed"] is False
    page = SimpleUploadedFile("deploy.html", b"<p>Deploys on <b>Tuesdays</b></p>", "text/html")
    uploaded = operator_client.post(docs, {"file": page}, format="multipart")
    assert uploaded.status_code == 201, uploaded.content
    assert uploaded.json()["document"]["name"] == "deploy.html"
    listed = viewer_client.get(docs).json()["results"]
    assert [(d["name"], d["chunk_count"]) for d in listed] == [("deploy.html", 1), ("leave.md", 1)]
    problem(viewer_client.post(docs, {"name": "x.md", "content": "x"}, format="json"), 403)
    problem(
        operator_client.post(docs, {"name": "x.md", "content": "x", "extra": 1}, format="json"), 400
    )
    problem(operator_client.post(docs, {"name": "x.md"}, format="json"), 400)
    pdf = SimpleUploadedFile("report.pdf", text_pdf([["Deploy freeze in December."]]))
    assert operator_client.post(docs, {"file": pdf}, format="multipart").status_code == 201
    found = viewer_client.post(f"{URL}/handbook/search", {"query": "deploy freeze"}, format="json")
    assert found.json()["hits"][0]["document"] == "report.pdf", found.content
    image = SimpleUploadedFile("chart.png", b"\x89PNG", "image/png")
    refused = problem(operator_client.post(docs, {"file": image}, format="multipart"), 415)
    assert "text/plain, text/markdown, text/html or application/pdf" in refused["detail"]
    document_id = KnowledgeDocument.objects.get(name="leave.md").pk
    problem(viewer_client.delete(f"{docs}/{document_id}"), 403)
    assert operator_client.delete(f"{docs}/{document_id}").status_code == 204
    problem(operator_client.delete(f"{docs}/{document_id}"), 404)


@override_settings(LOOPWRIGHT_KNOWLEDGE_MAX_DOCUMENT_BYTES=1000)
def test_an_oversized_document_is_413(operator_client: APIClient) -> None:
    make(operator_client)
    docs = f"{URL}/handbook/documents"
    refused = problem(operator_client.post(docs, {"name": "big.md", "content": "x" * 1001},
                                           format="json"), 413)  # fmt: skip
    assert "LOOPWRIGHT_KNOWLEDGE_MAX_DOCUMENT_BYTES" in refused["detail"]
    big = SimpleUploadedFile("big.txt", b"y" * 1001, "text/plain")
    problem(operator_client.post(docs, {"file": big}, format="multipart"), 413)


def test_an_external_http_base_holds_no_documents(operator_client: APIClient) -> None:
    make(operator_client, "remote", kind="external_rag", provider="external-http",
         api_url="http://127.0.0.1:9/rag")  # fmt: skip
    problem(operator_client.post(f"{URL}/remote/documents", {"name": "a.md", "content": "a"},
                                 format="json"), 409)  # fmt: skip


def test_folder_sync_under_the_root_only(operator_client: APIClient, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "hr" / "sub").mkdir(parents=True)
    (root / "hr" / "leave.md").write_text(LEAVE)
    (root / "hr" / "sub" / "deploy.txt").write_text("Deploys on Tuesdays.")
    (root / "hr" / "skip.bin").write_bytes(b"\x00")
    (root / "hr" / ".hidden.md").write_text("hidden")
    (root / "hr" / "report.pdf").write_bytes(text_pdf([["Expenses are paid monthly."]]))
    (tmp_path / "outside.md").write_text("secret")
    (root / "hr" / "link.md").symlink_to(tmp_path / "outside.md")
    make(operator_client)
    sync = f"{URL}/handbook/sync"
    with override_settings(LOOPWRIGHT_KNOWLEDGE_ROOT=str(root)):
        first = operator_client.post(sync, {"path": "hr"}, format="json")
        assert first.status_code == 200, first.content
        report = first.json()
        assert report["added"] == ["leave.md", "report.pdf", "sub/deploy.txt"]
        assert [r["name"] for r in report["refused"]] == ["link.md"]
        (root / "hr" / "sub" / "deploy.txt").unlink()
        second = operator_client.post(sync, {"path": str(root / "hr")}, format="json").json()
        assert second["unchanged"] == 2 and second["removed"] == ["sub/deploy.txt"]
        assert KnowledgeDocument.objects.get(name="leave.md").source == "folder:hr"
        for outside in ("..", "../", "/etc", "hr/../.."):
            refused = problem(operator_client.post(sync, {"path": outside}, format="json"), 400)
            assert "knowledge root" in refused["detail"]
        problem(operator_client.post(sync, {"path": "missing"}, format="json"), 400)


def test_a_test_search_is_recorded_for_the_caller(
    operator_client: APIClient, viewer_client: APIClient
) -> None:
    make(operator_client)
    operator_client.post(f"{URL}/handbook/documents", {"name": "leave.md", "content": LEAVE},
                         format="json")  # fmt: skip
    found = viewer_client.post(f"{URL}/handbook/search", {"query": "paid leave", "top_k": 2},
                               format="json")  # fmt: skip
    assert found.status_code == 200, found.content
    body = found.json()
    assert body["mode"] == "fulltext" and body["hits"][0]["document"] == "leave.md"
    assert body["hits"][0]["source"]["base"] == "handbook"
    row = Retrieval.objects.get()
    assert (row.employee, row.user, row.tool) == ("", "viewer", "knowledge_search")
    problem(viewer_client.post(f"{URL}/handbook/search", {"query": ""}, format="json"), 400)
    problem(viewer_client.post(f"{URL}/handbook/search", {"query": "x", "top_k": 99},
                               format="json"), 400)  # fmt: skip
    listed = viewer_client.get("/api/v1/retrievals").json()["results"]
    assert listed[0]["query"] == "paid leave" and listed[0]["hits"][0]["document"] == "leave.md"


def test_retrievals_by_run(viewer_client: APIClient) -> None:
    run = "00000000-0000-4000-8000-0000000000c1"
    Retrieval.objects.create(query="a", run_id=run, employee="ada")
    Retrieval.objects.create(query="b", employee="ada")
    listed = viewer_client.get("/api/v1/retrievals", {"run": run}).json()["results"]
    assert [r["query"] for r in listed] == ["a"]
    problem(viewer_client.get("/api/v1/retrievals", {"run": "not-a-uuid"}), 400)


def test_the_access_matrix(operator_client: APIClient, viewer_client: APIClient) -> None:
    make(operator_client)
    employee("ada")
    employee("bob")
    access = f"{URL}/handbook/access"
    assert viewer_client.get(access).json() == {"employees": []}
    saved = operator_client.put(access, {"employees": ["bob", "ada", "ada"]}, format="json")
    assert saved.status_code == 200 and saved.json() == {"employees": ["ada", "bob"]}
    assert KnowledgeAccess.objects.get(employee="ada").created_by == "operator"
    assert operator_client.put(access, {"employees": ["bob"]}, format="json").json() == {
        "employees": ["bob"]}  # fmt: skip
    refused = problem(
        operator_client.put(access, {"employees": ["bob", "ghost"]}, format="json"), 400
    )
    assert refused["errors"][0]["pointer"] == "/employees/1"
    problem(viewer_client.put(access, {"employees": []}, format="json"), 403)
    problem(operator_client.put(access, {"employees": "bob"}, format="json"), 400)
    problem(operator_client.put(access, {"people": []}, format="json"), 400)
    assert KnowledgeBase.objects.get().access.count() == 1

"""The knowledge pages: every role sees the bases (kind, documents, chunks), a base's documents,
the access matrix and the retrieval trace; an operator uploads a document, tests a search (the
ranked hits, recorded in the trace) and saves the matrix, a viewer is refused each write; the run
page lists the run's retrievals."""

from __future__ import annotations

import html
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from knowledge.models import KnowledgeAccess, KnowledgeDocument, Retrieval
from knowledge.search import knowledge_search
from knowledge.tools import KNOWLEDGE_SEARCH
from loops.services.runs import run_trigger
from orchestrator.agents.services import employee_create, model_endpoint_create
from tests.knowledge.test_tools import DEPLOY, LEAVE, SALARIES, grant, local_base
from tests.support.approvals import LEADER, MAKER, VERIFIER, approval_pattern
from tests.support.pdf import text_pdf
from tests.ui.conftest import make_user

pytestmark = pytest.mark.django_db
ClientAs = Callable[[str], Client]


@pytest.fixture
def client_as(db: None) -> ClientAs:
    def make(persona: str) -> Client:
        client = Client()
        client.force_login(make_user(persona))
        return client

    return make


@pytest.fixture
def bases() -> None:
    endpoint = model_endpoint_create(
        name="kb-ui", provider="openai", base_url="http://127.0.0.1:9/v1", model="m"
    )
    for username in (LEADER, MAKER, VERIFIER):
        employee_create(username=username, endpoint=endpoint, tools=["read", KNOWLEDGE_SEARCH])
    local_base("handbook", {"leave.md": LEAVE, "deploys.md": DEPLOY})
    local_base("payroll", {"salaries.md": SALARIES})
    grant(MAKER, "handbook")


def page(response: Any, status: int = 200) -> str:
    assert response.status_code == status, response.content[:3000]
    return html.unescape(response.content.decode())


def test_a_viewer_reads_the_bases_a_base_the_matrix_and_the_trace(
    client_as: ClientAs, bases: None
) -> None:
    viewer = client_as("viewer")
    listing = page(viewer.get("/knowledge"))
    assert 'id="base-handbook"' in listing and 'id="base-payroll"' in listing
    row = listing.split('id="base-handbook"', 1)[1].split("</tr>", 1)[0]
    assert ">local<" in row and '<td class="num">2</td>' in row, row

    detail = page(viewer.get("/knowledge/handbook"))
    assert "leave.md" in detail and "deploys.md" in detail
    assert "Upload a document" not in detail and "An operator can test searches" in detail

    matrix = page(viewer.get("/knowledge/access"))
    assert f'id="grant-{MAKER}-handbook"' in matrix
    cell = matrix.split(f'id="grant-{MAKER}-handbook"', 1)[1].split(">", 1)[0]
    assert "checked" in cell and "disabled" in cell
    other = matrix.split(f'id="grant-{MAKER}-payroll"', 1)[1].split(">", 1)[0]
    assert "checked" not in other
    assert "Save access" not in matrix

    assert "No knowledge searches" in page(viewer.get("/knowledge/retrievals"))
    assert page(viewer.get("/knowledge/nowhere"), 404)


def test_an_operator_uploads_and_tests_a_search_and_a_viewer_may_not(
    client_as: ClientAs, bases: None
) -> None:
    operator = client_as("operator")
    notes = SimpleUploadedFile("oncall.md", b"# On call\n\nThe on-call rota changes on Mondays.")
    uploaded = page(operator.post("/knowledge/handbook/documents", {"file": notes}, follow=True))
    assert "oncall.md: added and indexed." in uploaded and "oncall.md" in uploaded
    assert KnowledgeDocument.objects.filter(base__key="handbook", name="oncall.md").exists()

    wrong = SimpleUploadedFile("rota.png", b"\x89PNG")
    refused = page(operator.post("/knowledge/handbook/documents", {"file": wrong}), 400)
    assert "Upload a .txt, .md, .html or .pdf file." in refused
    scan = SimpleUploadedFile("scan.pdf", text_pdf([[]]))
    refused = page(operator.post("/knowledge/handbook/documents", {"file": scan}), 400)
    assert "no text layer" in refused
    rota = SimpleUploadedFile("rota.pdf", text_pdf([["The weekend rota is posted on Fridays."]]))
    added = page(operator.post("/knowledge/handbook/documents", {"file": rota}, follow=True))
    assert "rota.pdf: added and indexed." in added

    found = page(operator.post("/knowledge/handbook/search", {"query": "on-call rota", "top_k": 3}))
    results = found.split('id="search-results"', 1)[1]
    assert "oncall.md" in results and "The on-call rota changes on Mondays." in results
    assert Retrieval.objects.filter(query="on-call rota").exists()
    trace = page(operator.get("/knowledge/retrievals"))
    assert "on-call rota" in trace

    viewer = client_as("viewer")
    again = SimpleUploadedFile("x.md", b"text")
    assert viewer.post("/knowledge/handbook/documents", {"file": again}).status_code == 403
    assert viewer.post("/knowledge/handbook/search", {"query": "leave"}).status_code == 403
    assert not KnowledgeDocument.objects.filter(name="x.md").exists()


def test_the_matrix_saves_for_an_operator_and_is_refused_for_a_viewer(
    client_as: ClientAs, bases: None
) -> None:
    def granted() -> set[tuple[str, str]]:
        return set(KnowledgeAccess.objects.values_list("employee", "base__key"))

    assert granted() == {(MAKER, "handbook")}
    wanted = [f"{MAKER}|payroll", f"{VERIFIER}|handbook"]
    refused = client_as("viewer").post("/knowledge/access", {"grant": wanted})
    assert refused.status_code == 403 and granted() == {(MAKER, "handbook")}

    saved = page(client_as("operator").post("/knowledge/access", {"grant": wanted}, follow=True))
    assert "Knowledge access saved" in saved
    assert granted() == {(MAKER, "payroll"), (VERIFIER, "handbook")}
    cell = saved.split(f'id="grant-{MAKER}-payroll"', 1)[1].split(">", 1)[0]
    assert "checked" in cell and "disabled" not in cell


def test_the_trace_filters_by_employee_and_run_and_the_run_page_shows_its_retrievals(
    client_as: ClientAs, bases: None
) -> None:
    grant(VERIFIER, "handbook")
    run = run_trigger(pattern=approval_pattern("kb-ui"), actor="test", inputs={"label": "ui"})
    knowledge_search(employee=MAKER, query="paid leave", bases=["handbook"], top_k=3,
                     run_id=run.id, invocation="maker:0")  # fmt: skip
    knowledge_search(employee=VERIFIER, query="deploy day", bases=None, top_k=3,
                     run_id=uuid.uuid4(), invocation="verifier")  # fmt: skip
    viewer = client_as("viewer")

    by_run = page(viewer.get(f"/knowledge/retrievals?run={run.id}"))
    assert "paid leave" in by_run and "deploy day" not in by_run
    by_employee = page(viewer.get(f"/knowledge/retrievals?employee={VERIFIER}"))
    assert "deploy day" in by_employee and "paid leave" not in by_employee
    assert "Enter a valid UUID." in page(viewer.get("/knowledge/retrievals?run=nope"))

    run_page = page(viewer.get(f"/runs/{run.id}"))
    panel = run_page.split('id="retrievals"', 1)[1].split("</section>", 1)[0]
    assert "Maker 1" in panel and MAKER in panel and "paid leave" in panel
    assert "handbook" in panel and "leave.md" in panel and "deploy day" not in panel

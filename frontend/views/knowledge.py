"""Knowledge pages: the bases (name, kind, documents, chunks), a base's documents with an upload
form (text, Markdown, HTML) and a test search that shows the ranked hits, the Knowledge Access
matrix (employees x bases) and the Retrieval Trace (recent knowledge searches, filtered by
employee and run).

Every role reads; uploads, test searches (they are recorded, and may reach an external RAG
service) and matrix changes need the operator role. Writes go through ``knowledge.services``,
as the API's do; the pages read through ``frontend.selectors``.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from frontend.access import actor_of, can, ui_view
from frontend.selectors.knowledge import (
    AccessMatrix,
    access_matrix,
    base_documents,
    knowledge_base_get,
    knowledge_bases_overview,
)
from frontend.selectors.retrievals import retrieval_employees, retrieval_trace
from knowledge.search import SearchOutcome
from knowledge.services import (
    document_put,
    knowledge_access_grant,
    knowledge_access_revoke,
    knowledge_base_test_search,
)
from orchestrator.accounts.roles import Role
from orchestrator.errors import DomainError

#: Upload types by file name suffix: what the ingest service is told the text is.
UPLOAD_TYPES = {
    ".txt": "text/plain",
    ".text": "text/plain",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".html": "text/html",
    ".htm": "text/html",
    ".pdf": "application/pdf",
}
MAX_UPLOAD_BYTES = 5 * 1024 * 1024


class DocumentUploadForm(forms.Form):
    """One text, Markdown or HTML file (UTF-8) to add to a local base."""

    file = forms.FileField(
        help_text="A .txt, .md or .html file in UTF-8, or a PDF with a text layer, at most 5 MB. "
        "It is split into chunks and indexed at once."
    )
    name = forms.CharField(
        required=False, max_length=200, help_text="How results cite it; the file name if empty."
    )

    def clean_file(self) -> tuple[str, str, bytes]:
        """``(file name, content type, bytes)``; the ingest service reads the text."""
        upload = self.cleaned_data["file"]
        filename = PurePath(upload.name or "").name
        content_type = UPLOAD_TYPES.get(PurePath(filename).suffix.lower())
        if content_type is None:
            raise forms.ValidationError("Upload a .txt, .md, .html or .pdf file.")
        if upload.size > MAX_UPLOAD_BYTES:
            raise forms.ValidationError("The file is over 5 MB.")
        raw = upload.read()
        if not raw.strip():
            raise forms.ValidationError("The file is empty.")
        return filename, content_type, raw


class TestSearchForm(forms.Form):
    """A search of one base as the tools search it, to see what a query finds."""

    query = forms.CharField(max_length=2000, widget=forms.TextInput(attrs={"autocomplete": "off"}))
    top_k = forms.IntegerField(min_value=1, max_value=20, initial=5, label="Results")


class RetrievalFilterForm(forms.Form):
    """The trace page's filters."""

    employee = forms.ChoiceField(required=False)
    run = forms.UUIDField(required=False, label="Run id")

    def __init__(self, *args: Any, employees: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        choices = [("", "Every employee"), *((e, e) for e in employees)]
        self.fields["employee"].choices = choices  # type: ignore[attr-defined]


@ui_view()
def knowledge_list(request: HttpRequest) -> HttpResponse:
    """The bases: name, kind, how many documents and chunks."""
    context = {"bases": knowledge_bases_overview()}
    return render(request, "frontend/knowledge/list.html", context)


def _detail_page(
    request: HttpRequest,
    key: str,
    *,
    upload: DocumentUploadForm | None = None,
    search: TestSearchForm | None = None,
    outcome: SearchOutcome | None = None,
    status: int = 200,
) -> HttpResponse:
    base = knowledge_base_get(key)
    context = {
        "base": base,
        "documents": base_documents(base),
        "upload": upload or DocumentUploadForm(),
        "search": search or TestSearchForm(),
        "outcome": outcome,
        "can_write": can(request.user, Role.OPERATOR),
    }
    return render(request, "frontend/knowledge/detail.html", context, status=status)


@ui_view()
def knowledge_detail(request: HttpRequest, key: str) -> HttpResponse:
    """A base: its documents, the upload and test search forms (operators)."""
    return _detail_page(request, key)


@ui_view(methods=("POST",), write=Role.OPERATOR)
def knowledge_upload(request: HttpRequest, key: str) -> HttpResponse:
    """Add a document to a local base; problems at the form's fields (400)."""
    base = knowledge_base_get(key)
    form = DocumentUploadForm(request.POST, request.FILES)
    if form.is_valid():
        filename, content_type, raw = form.cleaned_data["file"]
        name = form.cleaned_data["name"] or filename
        try:
            document = document_put(
                base=base, name=name, raw=raw, content_type=content_type
            ).document
        except DomainError as exc:
            form.add_error(None, exc.detail)
        else:
            messages.success(request, f"{document.name}: added and indexed.")
            return redirect("ui:knowledge-base", key=key)
    return _detail_page(request, key, upload=form, status=400)


@ui_view(methods=("POST",), write=Role.OPERATOR)
def knowledge_test_search(request: HttpRequest, key: str) -> HttpResponse:
    """Search the base as the tools do and show the ranked hits (recorded in the trace)."""
    base = knowledge_base_get(key)
    form = TestSearchForm(request.POST)
    if not form.is_valid():
        return _detail_page(request, key, search=form, status=400)
    try:
        outcome = knowledge_base_test_search(
            base=base, query=form.cleaned_data["query"], top_k=form.cleaned_data["top_k"],
            user=actor_of(request),
        )  # fmt: skip
    except DomainError as exc:
        form.add_error(None, exc.detail)
        return _detail_page(request, key, search=form, status=400)
    return _detail_page(request, key, search=form, outcome=outcome)


@ui_view(methods=("GET", "POST"), write=Role.OPERATOR)
def knowledge_access(request: HttpRequest) -> HttpResponse:
    """The Knowledge Access matrix: which employee may read which base. An operator's POST
    saves the whole matrix (a checked box grants, an unchecked one revokes)."""
    matrix = access_matrix()
    if request.method == "POST":
        granted = set(request.POST.getlist("grant"))
        try:
            changed = access_matrix_save(matrix, granted, actor=actor_of(request))
        except DomainError as exc:
            messages.error(request, exc.detail)
        else:
            messages.success(request, f"Knowledge access saved ({changed} changed).")
        return redirect("ui:knowledge-access")
    context = {"matrix": matrix, "can_write": can(request.user, Role.OPERATOR)}
    return render(request, "frontend/knowledge/access.html", context)


@ui_view()
def knowledge_retrievals(request: HttpRequest) -> HttpResponse:
    """The Retrieval Trace: recent knowledge searches, newest first, by employee and run."""
    form = RetrievalFilterForm(request.GET or None, employees=retrieval_employees())
    employee, run_id = "", None
    if form.is_bound and form.is_valid():
        employee, run_id = form.cleaned_data["employee"], form.cleaned_data["run"]
    page = retrieval_trace(employee=employee, run_id=run_id, page=request.GET.get("page"))
    query = {k: v for k, v in (("employee", employee), ("run", run_id)) if v}
    context = {"form": form, "page": page, "filters": query}
    return render(request, "frontend/knowledge/retrievals.html", context)


def access_matrix_save(matrix: AccessMatrix, checked: set[str], *, actor: str) -> int:
    """Grant the checked pairs not granted, revoke the granted ones not checked; how many
    changed."""
    wanted = matrix.pairs(checked)
    for employee, base in sorted(wanted - matrix.granted):
        knowledge_access_grant(employee=employee, base=base, actor=actor)
    for employee, base in sorted(matrix.granted - wanted):
        knowledge_access_revoke(employee=employee, base=base, actor=actor)
    return len(wanted ^ matrix.granted)

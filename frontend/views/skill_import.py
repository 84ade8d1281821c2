"""The Git import page (``/ui/skills/import``): preview what ``gitSyncSkills`` would change, then
apply it with one button.

Operators only (as ``gitListSkills`` / ``gitSyncSkills`` in ``skillhub/api.py``), for the page
too: even the preview reaches out to the repository. The preview and the applied import run
``git_sync_skills``; the apply is pinned to the commit the preview showed, so a push in between
does not change what is written. The service judges the repository and the skills; its refusals
are shown at the fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from frontend.access import actor_of, ui_view
from frontend.diffs import DiffLine, json_diff, text_diff
from frontend.forms import SkillImportForm, add_service_errors
from orchestrator.accounts.roles import Role
from orchestrator.errors import DomainError, InvalidInput
from skillhub.services.gitimport import git_sync_skills

#: Fields whose change is shown as a diff of their text (the others as a diff of their JSON).
TEXT_FIELDS = ("code_template", "instructions", "description", "title")
#: Messages of the checkout that are about the ref rather than the repository.
_REF_ERRORS = ("not a ref", "git checkout failed")


@dataclass(frozen=True)
class FieldChange:
    name: str
    lines: list[DiffLine]
    #: For the folder's files: the digests of the zip (local → repository), no diff.
    digests: tuple[str | None, str | None] | None = None


def field_changes(changes: dict[str, dict[str, Any]]) -> list[FieldChange]:
    """The changed fields of one update, each as a readable diff (local → repository)."""
    shown: list[FieldChange] = []
    for name, change in changes.items():
        old, new = change.get("from"), change.get("to")
        if name == "archive_sha256":
            shown.append(FieldChange(name, [], (old, new)))
        elif name in TEXT_FIELDS:
            lines = text_diff(str(old or ""), str(new or ""), f"{name} (here)", f"{name} (Git)")
            shown.append(FieldChange(name, lines))
        else:
            shown.append(FieldChange(name, json_diff(old, new, f"{name} (here)", f"{name} (Git)")))
    return shown


def _refuse(form: SkillImportForm, exc: DomainError) -> None:
    """The service's refusal at its field: pointers first, else the ref or the repository."""
    errors = exc.extra.get("errors") if isinstance(exc, InvalidInput) else None
    if errors:
        add_service_errors(form, errors, "repository")
    elif isinstance(exc, InvalidInput):
        ref_error = str(exc.detail).startswith(_REF_ERRORS)
        form.add_error("ref" if ref_error else "repository", exc.detail)
    else:
        form.add_error(None, exc.detail)


def _page(
    request: HttpRequest, form: SkillImportForm, status: int = 200, **context: Any
) -> HttpResponse:
    return render(request, "frontend/skills/import.html", {"form": form, **context}, status=status)


@ui_view(methods=("GET", "POST"), write=Role.OPERATOR, form_page=True)
def skill_import_view(request: HttpRequest) -> HttpResponse:
    """GET: the form. POST ``step=preview``: the diff; POST ``step=apply``: write it, then the
    summary of what was created and updated."""
    if request.method != "POST":
        return _page(request, SkillImportForm())
    form = SkillImportForm(request.POST)
    applying = request.POST.get("step") == "apply"
    if not form.is_valid():
        if "commit" in form.errors:  # a hidden field: said on top
            form.add_error(None, "The previewed commit is not a commit id: preview again.")
        return _page(request, form, status=400)
    data = form.cleaned_data
    if applying and not data["commit"]:
        form.add_error(None, "Preview the import first: the import applies the previewed commit.")
        return _page(request, form, status=400)
    try:
        result = git_sync_skills(
            repository=data["repository"],
            ref=data["commit"] if applying else data["ref"],
            apply=applying,
            actor=actor_of(request),
        )
    except DomainError as exc:
        _refuse(form, exc)
        return _page(request, form, status=400)
    updates = [(u["tool_name"], field_changes(u["changes"])) for u in result["update"]]
    if applying:
        return _page(request, form, result=result, updates=updates)
    pinned = SkillImportForm(initial={**data, "commit": result["commit"]})
    return _page(request, pinned, preview=result, updates=updates)

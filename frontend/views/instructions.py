"""Instructions: the list (and, for an admin, creating one), and one instruction's page: its
versions, the text of the chosen one, a diff between two, where it is used and, for an admin,
saving a draft and publishing it. Writes go through ``instructions.services``, as the API's
(``/api/v1/instructions``, admin writes)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.db.models import OuterRef, Subquery
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from frontend.access import actor_of, can, ui_view
from frontend.forms import add_service_errors
from instructions.models import MAX_INSTRUCTION_CHARS, Instruction, InstructionVersion
from instructions.selectors import instruction_get_or_none, instruction_list
from instructions.services import (
    instruction_create,
    instruction_diff,
    instruction_publish,
    instruction_save_draft,
)
from instructions.usage import InstructionUsage, instruction_usages
from orchestrator.accounts.roles import Role
from orchestrator.errors import DomainError, InvalidInput

_TEXT_WIDGET = forms.Textarea(attrs={"rows": 14, "spellcheck": "false", "class": "mono"})
_REFERENCE_HELP = (
    "Prompts reference it as ${instructions.NAME} (the latest published version) or "
    "${instructions.NAME@3} (version 3)."
)


class InstructionNewForm(forms.Form):
    """A new instruction: its name, what it is for, and optionally the text of a first draft."""

    name = forms.CharField(
        max_length=100,
        help_text="Lower-case letters, digits, '-' or '_', a letter or digit first. "
        + _REFERENCE_HELP,
    )
    description = forms.CharField(required=False, widget=forms.TextInput(attrs={"class": "wide"}))
    text = forms.CharField(
        required=False,
        strip=False,
        max_length=MAX_INSTRUCTION_CHARS,
        widget=_TEXT_WIDGET,
        help_text="Saved as draft version 1; publish it to use it. Empty: no draft yet.",
    )


class InstructionDraftForm(forms.Form):
    """The text of the open draft (or of the next version, opened by saving)."""

    text = forms.CharField(
        required=False, strip=False, max_length=MAX_INSTRUCTION_CHARS, widget=_TEXT_WIDGET
    )
    note = forms.CharField(
        max_length=500, required=False, widget=forms.TextInput(attrs={"class": "wide"})
    )


def _list_page(request: HttpRequest, form: InstructionNewForm, status: int = 200) -> HttpResponse:
    changed = InstructionVersion.objects.filter(instruction=OuterRef("pk")).order_by("-updated_at")
    rows = instruction_list().annotate(last_change=Subquery(changed.values("updated_at")[:1]))
    can_create = can(request.user, Role.ADMIN)
    context = {"instructions": list(rows), "form": form, "can_create": can_create}
    return render(request, "frontend/instructions/list.html", context, status=status)


@ui_view(methods=("GET", "POST"), write=Role.ADMIN)
def instruction_list_view(request: HttpRequest) -> HttpResponse:
    """The instructions; an admin's POST creates one (problems at their fields, 400)."""
    if request.method != "POST":
        return _list_page(request, InstructionNewForm())
    form = InstructionNewForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            created = instruction_create(
                name=data["name"],
                description=data["description"],
                text=data["text"] or None,
                created_by=actor_of(request),
            )
        except DomainError as exc:
            _service_errors(form, exc, "name")
        else:
            messages.success(request, f"Instruction {created.name} created.")
            return redirect("ui:instruction", name=created.name)
    return _list_page(request, form, status=400)


def _service_errors(form: forms.Form, exc: DomainError, fallback: str) -> None:
    errors = exc.extra.get("errors") if isinstance(exc, InvalidInput) else None
    if errors:
        add_service_errors(form, errors, fallback)
    else:
        form.add_error(None, exc.detail)


def _instruction(name: str) -> Instruction:
    instruction = instruction_get_or_none(name)
    if instruction is None:
        raise Http404(f"There is no instruction {name!r}.")
    return instruction


def _number(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() and len(value) <= 9 else None


def _shown(versions: list[InstructionVersion], wanted: int | None) -> InstructionVersion | None:
    """The version ``?version=`` names, else the published head, else the newest."""
    by_number = {v.version: v for v in versions}
    if wanted is not None:
        if wanted not in by_number:
            raise Http404(f"There is no version {wanted}.")
        return by_number[wanted]
    published = [v for v in versions if v.is_published]
    return published[0] if published else (versions[0] if versions else None)


def _diff(request: HttpRequest, instruction: Instruction) -> dict[str, Any] | None:
    """``?from=N&to=M``: the unified diff of two versions' texts."""
    old, new = _number(request.GET.get("from")), _number(request.GET.get("to"))
    if old is None or new is None:
        return None
    return {"from": old, "to": new, "text": instruction_diff(instruction.name, old, new)}


def _usage_rows(used: list[InstructionUsage]) -> list[dict[str, Any]]:
    pages = {"employee": ("ui:employee", "username"), "pattern": ("ui:pattern", "key")}
    rows = []
    for usage in used:
        page = pages.get(usage.kind)
        url = reverse(page[0], kwargs={page[1]: usage.label}) if page else usage.url
        rows.append({"usage": usage, "page": url})
    return rows


def _detail_page(
    request: HttpRequest,
    instruction: Instruction,
    *,
    draft_form: InstructionDraftForm | None = None,
    status: int = 200,
) -> HttpResponse:
    versions = list(instruction.versions.order_by("-version"))
    draft = next((v for v in versions if not v.is_published), None)
    if draft_form is None:
        source = draft or instruction.current_version
        initial = {"text": source.text if source else "", "note": draft.note if draft else ""}
        draft_form = InstructionDraftForm(initial=initial)
    context = {
        "instruction": instruction,
        "versions": versions,
        "draft": draft,
        "shown": _shown(versions, _number(request.GET.get("version"))),
        "diff": _diff(request, instruction),
        "usages": _usage_rows(instruction_usages(instruction.name)),
        "draft_form": draft_form,
        "can_edit": can(request.user, Role.ADMIN),
        "diff_pair": (versions[1].version, versions[0].version) if len(versions) > 1 else None,
    }
    return render(request, "frontend/instructions/detail.html", context, status=status)


@ui_view()
def instruction_detail(request: HttpRequest, name: str) -> HttpResponse:
    return _detail_page(request, _instruction(name))


@ui_view(methods=("POST",), write=Role.ADMIN)
def instruction_draft(request: HttpRequest, name: str) -> HttpResponse:
    """Save the open draft (or open the next version); problems at their fields, 400."""
    instruction = _instruction(name)
    form = InstructionDraftForm(request.POST)
    if form.is_valid():
        try:
            saved = instruction_save_draft(
                name=instruction.name,
                text=form.cleaned_data["text"],
                note=form.cleaned_data["note"],
                created_by=actor_of(request),
            )
        except DomainError as exc:
            _service_errors(form, exc, "text")
        else:
            messages.success(request, f"Draft version {saved.version} saved. Publish it to use it.")
            return redirect("ui:instruction", name=instruction.name)
    return _detail_page(request, instruction, draft_form=form, status=400)


@ui_view(methods=("POST",), write=Role.ADMIN)
def instruction_publish_view(request: HttpRequest, name: str) -> HttpResponse:
    instruction = _instruction(name)
    try:
        published = instruction_publish(
            name=instruction.name,
            version=_number(request.POST.get("version")),
            published_by=actor_of(request),
        )
    except DomainError as exc:
        messages.error(request, exc.detail)
    else:
        messages.success(request, f"Version {published.version} of {name} is now published.")
    return redirect("ui:instruction", name=instruction.name)

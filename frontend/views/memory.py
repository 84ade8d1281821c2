"""The Memory Inspector: agent memory items (docs/memory.md), searchable and filtered by scope;
an item's page shows its content, tags and uses (the runs and chats that were given it, found it
or saved it), and lets an operator edit its content and tags or delete it. Every role reads.
Writes go through ``memory.services``, as the API's (``/api/v1/memories``, operator writes)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from frontend.access import actor_of, can, ui_view
from frontend.forms import add_service_errors
from memory.models import MAX_CONTENT_CHARS, MAX_TAG_CHARS, MAX_TAGS, MemoryItem, MemoryItemScope
from memory.services import memory_delete, memory_filter, memory_update
from orchestrator.accounts.roles import Role
from orchestrator.errors import InvalidInput, NotFound

PAGE_SIZE = 50
USES_SHOWN = 200


class MemoryFilterForm(forms.Form):
    """The list's filters: words and a scope."""

    q = forms.CharField(required=False, max_length=2000, label="Search")
    scope = forms.ChoiceField(
        required=False, choices=[("", "every scope"), *MemoryItemScope.choices]
    )


class MemoryEditForm(forms.Form):
    """An item's content and tags (comma-separated)."""

    content = forms.CharField(
        max_length=MAX_CONTENT_CHARS,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 6}),
        help_text=f"At most {MAX_CONTENT_CHARS} characters.",
    )
    tags = forms.CharField(
        required=False,
        max_length=MAX_TAGS * (MAX_TAG_CHARS + 2),
        help_text=f"Separated by commas; at most {MAX_TAGS}, each up to {MAX_TAG_CHARS} "
        "characters.",
    )

    def clean_tags(self) -> list[str]:
        return [t.strip() for t in self.cleaned_data["tags"].split(",") if t.strip()]


def _item(item_id: str) -> MemoryItem:
    item = MemoryItem.objects.filter(pk=item_id).first() if _is_uuid(item_id) else None
    if item is None:
        raise NotFound(f"No memory item {item_id}.")
    return item


def _is_uuid(value: str) -> bool:
    try:
        forms.UUIDField().clean(value)
    except forms.ValidationError:
        return False
    return True


@ui_view()
def memory_list(request: HttpRequest) -> HttpResponse:
    """Items newest first, filtered by words (all must appear) and scope."""
    form = MemoryFilterForm(request.GET)
    filters: dict[str, str] = {}
    items = MemoryItem.objects.none()
    if form.is_valid():
        filters = {k: v for k, v in form.cleaned_data.items() if v}
        items = memory_filter(**filters)
    page = Paginator(items, PAGE_SIZE).get_page(request.GET.get("page"))
    context = {"form": form, "filters": filters, "page": page}
    return render(request, "frontend/memory/list.html", context)


def _detail_page(
    request: HttpRequest, item: MemoryItem, form: MemoryEditForm, status: int = 200
) -> HttpResponse:
    context: dict[str, Any] = {
        "item": item,
        "uses": list(item.uses.all()[:USES_SHOWN]),
        "form": form,
        "can_edit": can(request.user, Role.OPERATOR),
    }
    return render(request, "frontend/memory/detail.html", context, status=status)


def _edit_form(item: MemoryItem, data: Any = None) -> MemoryEditForm:
    initial = {"content": item.content, "tags": ", ".join(item.tags)}
    return MemoryEditForm(data, initial=initial)


@ui_view()
def memory_detail(request: HttpRequest, item_id: str) -> HttpResponse:
    item = _item(item_id)
    return _detail_page(request, item, _edit_form(item))


@ui_view(methods=("POST",), write=Role.OPERATOR)
def memory_edit(request: HttpRequest, item_id: str) -> HttpResponse:
    """Change the content and tags; problems at their fields (400)."""
    item = _item(item_id)
    form = _edit_form(item, request.POST)
    if form.is_valid():
        try:
            memory_update(item, actor=actor_of(request), **form.cleaned_data)
        except InvalidInput as exc:
            add_service_errors(form, exc.extra.get("errors") or [{"detail": exc.detail}])
        else:
            messages.success(request, "Memory item saved.")
            return redirect("ui:memory-item", item_id=item.id)
    return _detail_page(request, _item(item_id), form, status=400)


@ui_view(methods=("POST",), write=Role.OPERATOR)
def memory_delete_view(request: HttpRequest, item_id: str) -> HttpResponse:
    """Delete the item (and its uses); no later prompt is given it."""
    memory_delete(_item(item_id))
    messages.success(request, f"Memory item {item_id} deleted.")
    return redirect("ui:memory")

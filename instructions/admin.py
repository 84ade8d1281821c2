"""Django admin for instructions, with the API's rules: writes go through the services,
published versions are read-only and cannot be deleted, and an instruction still referenced
cannot be deleted."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from harness.admin import PublishedVersionAdmin, adopt, without_bulk_delete
from instructions.models import (
    MAX_INSTRUCTION_CHARS,
    Instruction,
    InstructionVersion,
    VersionStatus,
)
from instructions.services import (
    instruction_create,
    instruction_delete,
    instruction_publish,
    instruction_save_draft,
    instruction_update,
)
from instructions.usage import instruction_usages
from orchestrator.errors import DomainError


class InstructionCreateForm(forms.ModelForm[Instruction]):
    text = forms.CharField(
        required=False,
        strip=False,
        max_length=MAX_INSTRUCTION_CHARS,
        widget=forms.Textarea,
        help_text="Text of version 1, saved as a draft (publish it to use it).",
    )

    class Meta:
        model = Instruction
        fields = ["name", "description"]


class InstructionVersionInline(admin.TabularInline[InstructionVersion, Instruction]):
    model = InstructionVersion
    fields = ("version", "status", "note", "created_by", "created_at", "published_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Instruction)
class InstructionAdmin(admin.ModelAdmin[Instruction]):
    list_display = ("name", "current_version", "updated_at")
    search_fields = ("name", "description")
    inlines = [InstructionVersionInline]

    def get_inlines(self, request: HttpRequest, obj: Instruction | None) -> Any:
        return self.inlines if obj is not None else []

    def get_form(
        self,
        request: HttpRequest,
        obj: Instruction | None = None,
        change: bool = False,
        **kw: Any,
    ) -> Any:
        if obj is None:
            kw["form"] = InstructionCreateForm
        return super().get_form(request, obj, change=change, **kw)

    def get_fields(self, request: HttpRequest, obj: Instruction | None = None) -> Any:
        return ["name", "description", "text"] if obj is None else ["name", "description"]

    def get_readonly_fields(self, request: HttpRequest, obj: Instruction | None = None) -> Any:
        return ["name"] if obj is not None else []

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        return without_bulk_delete(super().get_actions(request))

    def has_delete_permission(self, request: HttpRequest, obj: Instruction | None = None) -> bool:
        if obj is not None and instruction_usages(obj.name):
            return False
        return super().has_delete_permission(request, obj)

    def save_model(self, request: HttpRequest, obj: Instruction, form: Any, change: bool) -> None:
        if change:
            instruction_update(name=obj.name, description=obj.description)
            return
        created = instruction_create(
            name=obj.name,
            description=obj.description,
            text=form.cleaned_data.get("text") or None,
            created_by=request.user.get_username(),
        )
        adopt(obj, created)

    def delete_model(self, request: HttpRequest, obj: Instruction) -> None:
        instruction_delete(name=obj.name)


class InstructionVersionForm(forms.ModelForm[InstructionVersion]):
    text = forms.CharField(
        required=False, strip=False, max_length=MAX_INSTRUCTION_CHARS, widget=forms.Textarea
    )

    class Meta:
        model = InstructionVersion
        fields = ["instruction", "text", "note"]


@admin.register(InstructionVersion)
class InstructionVersionAdmin(PublishedVersionAdmin):
    """Adding a version saves a draft (into the open one, if any); only drafts can be edited."""

    form = InstructionVersionForm
    list_display = ("instruction", "version", "status", "created_by", "created_at", "published_at")
    list_filter = ("status", "instruction")
    actions = ["publish_drafts"]
    owner_field = "instruction"
    content_fields = ("text", "note")

    def save_model(
        self, request: HttpRequest, obj: InstructionVersion, form: Any, change: bool
    ) -> None:
        saved = instruction_save_draft(
            name=obj.instruction.name,
            text=form.cleaned_data["text"],
            note=form.cleaned_data.get("note", ""),
            created_by=request.user.get_username(),
        )
        adopt(obj, saved)

    @admin.action(description="Publish selected drafts")
    def publish_drafts(self, request: HttpRequest, queryset: QuerySet[InstructionVersion]) -> None:
        drafts = queryset.filter(status=VersionStatus.DRAFT).select_related("instruction")
        for draft in drafts:
            try:
                instruction_publish(
                    name=draft.instruction.name,
                    version=draft.version,
                    published_by=request.user.get_username(),
                )
            except DomainError as exc:
                self.message_user(request, exc.detail, level=messages.ERROR)
            else:
                self.message_user(request, f"Published {draft.instruction.name}@{draft.version}.")

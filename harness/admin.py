"""Django admin for harness profiles, with the API's rules: writes go through the services,
published versions are read-only and cannot be deleted, seeded profiles cannot be deleted."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from harness.models import HarnessProfile, HarnessProfileVersion, VersionStatus
from harness.schema import settings_problems
from harness.services import (
    SEEDED_TAGS,
    profile_create,
    profile_delete,
    profile_publish,
    profile_save_draft,
    profile_update,
)
from orchestrator.errors import DomainError


def _check_settings(form: forms.ModelForm[Any]) -> None:
    for problem in settings_problems(form.cleaned_data.get("settings")):
        form.add_error("settings", f"{problem['pointer'] or '/'}: {problem['detail']}")


def without_bulk_delete(actions: dict[str, Any]) -> dict[str, Any]:
    # Bulk deletion would bypass the per-object rules (seeded profiles, uses, published rows).
    actions.pop("delete_selected", None)
    return actions


def adopt(obj: Any, saved: Any) -> None:
    """Point the admin's unsaved object at the row the service wrote (for redirects and logs)."""
    obj.pk = saved.pk
    obj._state.adding = False


class ProfileCreateForm(forms.ModelForm[HarnessProfile]):
    settings = forms.JSONField(initial=dict, help_text="Settings of version 1 (published at once).")

    class Meta:
        model = HarnessProfile
        fields = ["tag", "description"]

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean()
        _check_settings(self)
        return cleaned


class VersionInline(admin.TabularInline[HarnessProfileVersion, HarnessProfile]):
    model = HarnessProfileVersion
    fields = ("version", "status", "note", "created_by", "created_at", "published_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(HarnessProfile)
class HarnessProfileAdmin(admin.ModelAdmin[HarnessProfile]):
    list_display = ("tag", "current_version", "updated_at")
    search_fields = ("tag", "description")
    inlines = [VersionInline]

    def get_inlines(self, request: HttpRequest, obj: HarnessProfile | None) -> Any:
        return self.inlines if obj is not None else []

    def get_form(
        self,
        request: HttpRequest,
        obj: HarnessProfile | None = None,
        change: bool = False,
        **kw: Any,
    ) -> Any:
        if obj is None:
            kw["form"] = ProfileCreateForm
        return super().get_form(request, obj, change=change, **kw)

    def get_fields(self, request: HttpRequest, obj: HarnessProfile | None = None) -> Any:
        return ["tag", "description", "settings"] if obj is None else ["tag", "description"]

    def get_readonly_fields(self, request: HttpRequest, obj: HarnessProfile | None = None) -> Any:
        return ["tag"] if obj is not None else []

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        return without_bulk_delete(super().get_actions(request))

    def has_delete_permission(
        self, request: HttpRequest, obj: HarnessProfile | None = None
    ) -> bool:
        if obj is not None and obj.tag in SEEDED_TAGS:
            return False
        return super().has_delete_permission(request, obj)

    def save_model(
        self, request: HttpRequest, obj: HarnessProfile, form: Any, change: bool
    ) -> None:
        if change:
            profile_update(tag=obj.tag, description=obj.description)
            return
        created = profile_create(
            tag=obj.tag,
            description=obj.description,
            settings=form.cleaned_data["settings"],
            created_by=request.user.get_username(),
        )
        adopt(obj, created)

    def delete_model(self, request: HttpRequest, obj: HarnessProfile) -> None:
        profile_delete(tag=obj.tag)


class VersionForm(forms.ModelForm[HarnessProfileVersion]):
    class Meta:
        model = HarnessProfileVersion
        fields = ["profile", "settings", "note"]

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean()
        _check_settings(self)
        return cleaned


class PublishedVersionAdmin(admin.ModelAdmin[Any]):
    """The admin of a :class:`~harness.models.VersionRow`: a published row is read-only
    and cannot be deleted; a draft's ``owner_field`` is fixed; no bulk delete."""

    owner_field = "profile"
    content_fields: tuple[str, ...] = ("settings", "note")
    _always_readonly = (
        "version",
        "status",
        "created_by",
        "created_at",
        "updated_at",
        "published_by",
        "published_at",
    )

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ()
        if obj.is_published:
            return (self.owner_field, *self.content_fields, *self._always_readonly)
        return (self.owner_field, *self._always_readonly)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        return without_bulk_delete(super().get_actions(request))

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.is_published:
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.is_published:
            return False
        return super().has_delete_permission(request, obj)


@admin.register(HarnessProfileVersion)
class HarnessProfileVersionAdmin(PublishedVersionAdmin):
    """Adding a version saves a draft (into the open one, if any); only drafts can be edited."""

    form = VersionForm
    list_display = ("profile", "version", "status", "created_by", "created_at", "published_at")
    list_filter = ("status", "profile")
    actions = ["publish_drafts"]

    def save_model(
        self, request: HttpRequest, obj: HarnessProfileVersion, form: Any, change: bool
    ) -> None:
        saved = profile_save_draft(
            tag=obj.profile.tag,
            settings=form.cleaned_data["settings"],
            note=form.cleaned_data.get("note", ""),
            created_by=request.user.get_username(),
        )
        adopt(obj, saved)

    @admin.action(description="Publish selected drafts")
    def publish_drafts(
        self, request: HttpRequest, queryset: QuerySet[HarnessProfileVersion]
    ) -> None:
        drafts = queryset.filter(status=VersionStatus.DRAFT).select_related("profile")
        for draft in drafts:
            try:
                profile_publish(
                    tag=draft.profile.tag,
                    version=draft.version,
                    published_by=request.user.get_username(),
                )
            except DomainError as exc:
                self.message_user(request, exc.detail, level=messages.ERROR)
            else:
                self.message_user(request, f"Published {draft.profile.tag}@{draft.version}.")

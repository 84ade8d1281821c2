"""Patterns are configuration, editable here; runs, their events and steps, and path locks are
the engine's tables, view-only (status changes go through the API's human actions)."""

from __future__ import annotations

from django.contrib import admin

from loops.models import LoopEvent, LoopPattern, LoopRun, LoopStep, PathLock
from orchestrator.admin_readonly import ViewOnly, ViewOnlyAdmin


@admin.register(LoopPattern)
class LoopPatternAdmin(admin.ModelAdmin[LoopPattern]):
    list_display = ("key", "trigger_type", "autonomy_level", "enabled", "version", "updated_at")
    search_fields = ("key", "title")
    readonly_fields = ("version", "created_at", "updated_at")


class EventInline(ViewOnly, admin.TabularInline[LoopEvent, LoopRun]):
    model = LoopEvent
    extra = 0
    can_delete = False
    readonly_fields = ("seq", "type", "from_status", "to_status", "actor", "data", "created_at")


@admin.register(LoopRun)
class LoopRunAdmin(ViewOnlyAdmin):
    """Runs are view-only here: status changes go through the API's human actions."""

    list_display = ("id", "pattern", "status", "trigger_type", "attempts", "created_at")
    list_filter = ("status", "trigger_type")
    inlines = [EventInline]


@admin.register(LoopStep)
class LoopStepAdmin(ViewOnlyAdmin):
    list_display = ("run", "seq", "role", "kind", "status", "name")


@admin.register(PathLock)
class PathLockAdmin(ViewOnlyAdmin):
    list_display = ("run", "repository_key", "path", "acquired_at")

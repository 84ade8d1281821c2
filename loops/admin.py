from __future__ import annotations

from django.contrib import admin

from loops.models import LoopEvent, LoopPattern, LoopRun, LoopStep, PathLock


@admin.register(LoopPattern)
class LoopPatternAdmin(admin.ModelAdmin[LoopPattern]):
    list_display = ("key", "trigger_type", "autonomy_level", "enabled", "version", "updated_at")
    search_fields = ("key", "title")
    readonly_fields = ("version", "created_at", "updated_at")


class EventInline(admin.TabularInline[LoopEvent, LoopRun]):
    model = LoopEvent
    extra = 0
    can_delete = False
    readonly_fields = ("seq", "type", "from_status", "to_status", "actor", "data", "created_at")


@admin.register(LoopRun)
class LoopRunAdmin(admin.ModelAdmin[LoopRun]):
    """Runs are read-only here: status changes go through the API's human actions."""

    list_display = ("id", "pattern", "status", "trigger_type", "attempts", "created_at")
    list_filter = ("status", "trigger_type")
    inlines = [EventInline]

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False

    def has_add_permission(self, request: object) -> bool:
        return False


admin.site.register(LoopStep)
admin.site.register(PathLock)

"""Admin views of the Skill Hub (read-mostly: writes go through the API and its validation)."""

from __future__ import annotations

from django.contrib import admin

from orchestrator.admin_readonly import ViewOnlyAdmin
from skillhub.models import Skill, SkillEnvironment, SkillExecution, SkillLoopConfig


@admin.register(Skill)
class SkillAdmin(admin.ModelAdmin[Skill]):
    list_display = ["tool_name", "title", "language", "enabled", "tool_scope", "source"]
    list_filter = ["language", "enabled", "tool_scope", "source"]
    search_fields = ["tool_name", "title"]
    readonly_fields = ["tool_name", "source_commit", "created_by", "created_at", "updated_at"]
    exclude = ["archive"]


@admin.register(SkillExecution)
class SkillExecutionAdmin(ViewOnlyAdmin):
    """View-only: executions are the engine's record of each run of a skill."""

    list_display = ["id", "tool_name", "status", "principal", "origin", "created_at"]
    list_filter = ["status", "origin", "language"]
    search_fields = ["tool_name", "principal"]


@admin.register(SkillLoopConfig)
class SkillLoopConfigAdmin(admin.ModelAdmin[SkillLoopConfig]):
    list_display = ["skill", "requires_review", "updated_at"]


@admin.register(SkillEnvironment)
class SkillEnvironmentAdmin(ViewOnlyAdmin):
    """View-only: environments are built and cleared through initEnv / clearStorage."""

    list_display = ["key", "language", "status", "size_bytes", "built_at"]
    list_filter = ["language", "status"]
    search_fields = ["key"]

from __future__ import annotations

from django.contrib import admin

from gateway.models import ChatCompletionRecord, EmployeeChatSettings, EmployeeGrant
from orchestrator.admin_readonly import ViewOnlyAdmin


@admin.register(EmployeeGrant)
class EmployeeGrantAdmin(admin.ModelAdmin[EmployeeGrant]):
    list_display = ("employee", "user", "created_by", "created_at")
    list_filter = ("employee",)
    search_fields = ("employee__username", "user__username")
    readonly_fields = ("created_at",)


@admin.register(EmployeeChatSettings)
class EmployeeChatSettingsAdmin(admin.ModelAdmin[EmployeeChatSettings]):
    list_display = ("employee", "updated_by", "updated_at")
    search_fields = ("employee__username",)
    readonly_fields = ("updated_at",)


@admin.register(ChatCompletionRecord)
class ChatCompletionRecordAdmin(ViewOnlyAdmin):
    """View-only: records are written by the endpoint, once per request."""

    list_display = (
        "id",
        "employee_username",
        "user",
        "status",
        "finish_reason",
        "stream",
        "duration_ms",
        "prompt_tokens",
        "completion_tokens",
        "created_at",
    )
    list_filter = ("status", "stream", "employee_username")
    search_fields = ("id", "employee_username", "user__username")

"""Knowledge bases and the access matrix in the admin; documents and retrievals read-only
(documents change through the API or the UI, which chunk and index them)."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from knowledge.models import KnowledgeAccess, KnowledgeBase, KnowledgeDocument, Retrieval


@admin.register(KnowledgeBase)
class KnowledgeBaseAdmin(admin.ModelAdmin[KnowledgeBase]):
    list_display = ["key", "name", "kind", "provider", "embedding_model", "embedded_model"]
    list_filter = ["kind", "provider"]
    readonly_fields = ["embedded_model", "revision", "created_at", "updated_at"]


@admin.register(KnowledgeAccess)
class KnowledgeAccessAdmin(admin.ModelAdmin[KnowledgeAccess]):
    list_display = ["employee", "base", "created_by", "created_at"]
    list_filter = ["base"]


class _ReadOnly:
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(KnowledgeDocument)
class KnowledgeDocumentAdmin(_ReadOnly, admin.ModelAdmin[KnowledgeDocument]):
    list_display = ["name", "base", "source", "content_type", "chars", "updated_at"]
    list_filter = ["base", "content_type"]


@admin.register(Retrieval)
class RetrievalAdmin(_ReadOnly, admin.ModelAdmin[Retrieval]):
    list_display = [
        "created_at",
        "tool",
        "employee",
        "user",
        "query",
        "mode",
        "latency_ms",
        "error",
    ]
    list_filter = ["tool", "mode", "chat"]

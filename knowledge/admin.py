"""Knowledge bases and the access matrix in the admin; documents and retrievals read-only
(documents change through the API or the UI, which chunk and index them)."""

from __future__ import annotations

from django.contrib import admin

from knowledge.models import KnowledgeAccess, KnowledgeBase, KnowledgeDocument, Retrieval
from orchestrator.admin_readonly import ViewOnlyAdmin


@admin.register(KnowledgeBase)
class KnowledgeBaseAdmin(admin.ModelAdmin[KnowledgeBase]):
    list_display = ["key", "name", "kind", "provider", "embedding_model", "embedded_model"]
    list_filter = ["kind", "provider"]
    readonly_fields = ["embedded_model", "revision", "created_at", "updated_at"]


@admin.register(KnowledgeAccess)
class KnowledgeAccessAdmin(admin.ModelAdmin[KnowledgeAccess]):
    list_display = ["employee", "base", "created_by", "created_at"]
    list_filter = ["base"]


@admin.register(KnowledgeDocument)
class KnowledgeDocumentAdmin(ViewOnlyAdmin):
    list_display = ["name", "base", "source", "content_type", "chars", "updated_at"]
    list_filter = ["base", "content_type"]


@admin.register(Retrieval)
class RetrievalAdmin(ViewOnlyAdmin):
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

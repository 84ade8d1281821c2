"""API shapes of knowledge bases, their documents, searches, access and retrievals. A key is
never shown: only the environment variable holding it, and whether it is allowed and set."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from knowledge.models import (
    BASE_KEY,
    MAX_DOCUMENT_NAME,
    KnowledgeBase,
    KnowledgeDocument,
    Retrieval,
)
from knowledge.search import MAX_QUERY_CHARS, MAX_TOP_K
from orchestrator.strict import StrictModelSerializer, StrictSerializer
from runtime.secrets import api_key_configured

MAX_EMPLOYEES = 1000


class KnowledgeBaseSerializer(StrictModelSerializer[KnowledgeBase]):
    api_key_configured = serializers.SerializerMethodField(
        help_text="Whether api_key_env is allowed and set in this server process."
    )
    embedding_key_configured = serializers.SerializerMethodField(
        help_text="Whether embedding_key_env is allowed and set in this server process."
    )
    document_count = serializers.IntegerField(read_only=True, default=0)

    class Meta:
        model = KnowledgeBase
        fields = [
            "key", "name", "description", "kind", "provider", "api_url", "api_key_env",
            "api_key_configured", "namespace", "top_k", "score_threshold", "embedding_url",
            "embedding_model", "embedding_key_env", "embedding_key_configured",
            "embedding_dims", "embedded_model", "document_count", "created_at", "updated_at",
        ]  # fmt: skip
        read_only_fields = ["embedded_model", "created_at", "updated_at"]
        extra_kwargs = {
            "key": {"help_text": f"Lower-case words joined by - or _ ({BASE_KEY}); never changes."},
            "api_key_env": {"help_text": "The environment variable holding the provider's key "
                            "(a name the secret rule allows); the key is never stored."},
            "embedding_url": {"help_text": "An OpenAI-compatible base URL (POST {url}/embeddings); "
                              "empty: full-text search only."},
            "embedding_dims": {"help_text": "The vector length the model gives (0: any); checked "
                               "on every answer."},
        }  # fmt: skip

    def get_api_key_configured(self, base: KnowledgeBase) -> bool:
        return bool(base.api_key_env) and api_key_configured(base.api_key_env)

    def get_embedding_key_configured(self, base: KnowledgeBase) -> bool:
        return bool(base.embedding_key_env) and api_key_configured(base.embedding_key_env)


class KnowledgeDocumentSerializer(serializers.ModelSerializer[KnowledgeDocument]):
    chunk_count = serializers.IntegerField(read_only=True, default=0)

    class Meta:
        model = KnowledgeDocument
        fields = [
            "id", "name", "source", "content_type", "sha256", "chars", "chunk_count",
            "created_at", "updated_at",
        ]  # fmt: skip
        read_only_fields = fields


class DocumentStoredSerializer(serializers.Serializer[Any]):
    document = KnowledgeDocumentSerializer()
    changed = serializers.BooleanField(help_text="False when the same bytes were stored already.")
    chunks = serializers.IntegerField()
    embedding_error = serializers.CharField(
        help_text="Why the chunks have no vectors yet (empty when they have, or need none)."
    )


class DocumentJsonSerializer(StrictSerializer):
    """A document sent as JSON text."""

    name = serializers.CharField(max_length=MAX_DOCUMENT_NAME)
    content = serializers.CharField(trim_whitespace=False)
    content_type = serializers.CharField(
        max_length=100, required=False, default="",
        help_text="text/plain, text/markdown or text/html; empty: from the name's extension.",
    )  # fmt: skip


class DocumentUploadSerializer(StrictSerializer):
    """A document sent as a multipart file."""

    file = serializers.FileField(allow_empty_file=False)
    name = serializers.CharField(
        max_length=MAX_DOCUMENT_NAME, required=False, default="",
        help_text="The document's name; empty: the file's name.",
    )  # fmt: skip
    content_type = serializers.CharField(max_length=100, required=False, default="")


class FolderSyncSerializer(StrictSerializer):
    path = serializers.CharField(
        max_length=1000,
        help_text="A folder under LOOPWRIGHT_KNOWLEDGE_ROOT (relative to it, or absolute).",
    )


class GitSyncSerializer(StrictSerializer):
    repository = serializers.CharField(
        max_length=2000,
        help_text="The repository's URL (https:// by default, LOOPWRIGHT_GIT_SCHEMES; hosts may be "
        "limited by LOOPWRIGHT_GIT_HOSTS), checked by the outbound guard.",
    )
    ref = serializers.CharField(
        max_length=200, required=False, default="HEAD", help_text="A branch, tag or commit."
    )
    path = serializers.CharField(
        max_length=1000, required=False, default="", allow_blank=True,
        help_text="A folder of the repository; empty: the whole repository.",
    )  # fmt: skip


class FolderSyncedSerializer(serializers.Serializer[Any]):
    folder = serializers.CharField()
    commit = serializers.CharField(help_text="The commit a Git sync read; empty for a folder.")
    added = serializers.ListField(child=serializers.CharField())
    updated = serializers.ListField(child=serializers.CharField())
    unchanged = serializers.IntegerField()
    removed = serializers.ListField(child=serializers.CharField())
    refused = serializers.ListField(child=serializers.DictField(child=serializers.CharField()))
    embedding_errors = serializers.IntegerField()


class KnowledgeSearchSerializer(StrictSerializer):
    query = serializers.CharField(max_length=MAX_QUERY_CHARS)
    top_k = serializers.IntegerField(min_value=1, max_value=MAX_TOP_K, required=False, default=5)


class HitSerializer(serializers.Serializer[Any]):
    base = serializers.CharField()
    document = serializers.CharField()
    chunk_id = serializers.CharField()
    text = serializers.CharField()
    score = serializers.FloatField()
    source = serializers.DictField()  # type: ignore[assignment]  # the field named "source"


class SearchOutcomeSerializer(serializers.Serializer[Any]):
    hits = HitSerializer(many=True)
    bases = serializers.ListField(child=serializers.CharField())
    latency_ms = serializers.IntegerField()
    mode = serializers.ChoiceField(choices=["fulltext", "hybrid", "external"])


class KnowledgeAccessSerializer(StrictSerializer):
    employees = serializers.ListField(
        child=serializers.CharField(max_length=150), max_length=MAX_EMPLOYEES,
        help_text="The AI employees (usernames) that may read the base; replaces the list.",
    )  # fmt: skip


class RetrievalSerializer(serializers.ModelSerializer[Retrieval]):
    class Meta:
        model = Retrieval
        fields = [
            "id", "run_id", "invocation", "chat", "employee", "user", "tool", "query", "bases",
            "hits", "mode", "latency_ms", "error", "created_at",
        ]  # fmt: skip
        read_only_fields = fields

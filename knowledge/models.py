"""Knowledge bases (docs/knowledge.md): documents cut into chunks that employees search, who may
read which base (the access matrix), and every search made (retrievals).

A base is ``local`` (documents stored and searched here: full text, plus vectors when it has an
embedding endpoint) or ``external_rag`` (``external-http``: a remote search service answers;
``e5-http``: documents stored here, vectors from an E5 embedding endpoint). A row holds where a
service is and the NAME of the environment variable with its key, never a secret. Full text
lives beside the chunk table (PostgreSQL: a GIN index over ``to_tsvector``; SQLite: an FTS5
table kept in sync by triggers), made by the migrations.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from orchestrator.guard import outbound_url_problem, secret_rule

#: Lower-case words joined by single hyphens or underscores.
BASE_KEY = r"^[a-z0-9]+([-_][a-z0-9]+)*$"
MAX_KEY = 64
MAX_NAME = 150
MAX_DOCUMENT_NAME = 255
MAX_TOP_K = 50
MAX_EMBEDDING_DIMS = 8192


class KnowledgeBaseKind(models.TextChoices):
    LOCAL = "local", "local (documents stored and searched here)"
    EXTERNAL_RAG = "external_rag", "external RAG (a remote service or an E5 endpoint)"


class KnowledgeProvider(models.TextChoices):
    NONE = "", "none (local bases)"
    EXTERNAL_HTTP = "external-http", "external-http (POST {api_url}/search)"
    E5_HTTP = "e5-http", "e5-http (documents here, E5 vectors from an embedding endpoint)"


def _validate_env_name(value: str, field: str) -> None:
    if value:
        refusal = secret_rule().check(value, field=field)
        if refusal is not None:
            raise ValidationError(refusal)


def validate_api_key_env(value: str) -> None:
    _validate_env_name(value, "api_key_env")


def validate_embedding_key_env(value: str) -> None:
    _validate_env_name(value, "embedding_key_env")


class KnowledgeBase(models.Model):
    """A searchable collection of documents (or a remote RAG service standing for one)."""

    key = models.CharField(
        max_length=MAX_KEY,
        unique=True,
        validators=[RegexValidator(BASE_KEY, "Use lower-case words joined by - or _.")],
    )
    name = models.CharField(max_length=MAX_NAME)
    description = models.TextField(blank=True, default="")
    kind = models.CharField(
        max_length=20, choices=KnowledgeBaseKind.choices, default=KnowledgeBaseKind.LOCAL
    )
    # external_rag
    provider = models.CharField(
        max_length=20, choices=KnowledgeProvider.choices, blank=True, default=""
    )
    api_url = models.URLField(max_length=500, blank=True, default="")
    #: The environment variable holding the service's key (never the key).
    api_key_env = models.CharField(
        max_length=100, blank=True, default="", validators=[validate_api_key_env]
    )
    namespace = models.CharField(max_length=200, blank=True, default="")
    top_k = models.PositiveIntegerField(
        default=5, validators=[MinValueValidator(1), MaxValueValidator(MAX_TOP_K)]
    )
    score_threshold = models.FloatField(default=0.0)
    # local and e5-http: an OpenAI-compatible embeddings endpoint ("" = full text only)
    embedding_url = models.URLField(max_length=500, blank=True, default="")
    embedding_model = models.CharField(max_length=200, blank=True, default="")
    embedding_key_env = models.CharField(
        max_length=100, blank=True, default="", validators=[validate_embedding_key_env]
    )
    embedding_dims = models.PositiveIntegerField(
        default=0, validators=[MaxValueValidator(MAX_EMBEDDING_DIMS)]
    )
    #: The ``model@dims`` the stored vectors were made with ("" = none yet).
    embedded_model = models.CharField(max_length=250, blank=True, default="", editable=False)
    #: Bumped by every change to the base's chunks (processes cache vectors by it).
    revision = models.PositiveBigIntegerField(default=0, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["key"]
        verbose_name = "knowledge base"

    def __str__(self) -> str:
        return self.key

    @property
    def is_remote(self) -> bool:
        """Searched by a remote service (no documents here)."""
        return (
            self.kind == KnowledgeBaseKind.EXTERNAL_RAG
            and self.provider == KnowledgeProvider.EXTERNAL_HTTP
        )

    @property
    def embeds(self) -> bool:
        """Its chunks get vectors (an embedding endpoint and model are set)."""
        return bool(self.embedding_url and self.embedding_model) and not self.is_remote

    @property
    def model_stamp(self) -> str:
        """What the vectors of this base should be made with now (``model@dims``)."""
        return f"{self.embedding_model}@{self.embedding_dims}" if self.embeds else ""

    def clean(self) -> None:
        problems: dict[str, Any] = {}
        if self.kind == KnowledgeBaseKind.LOCAL and self.provider:
            problems["provider"] = "A local base has no provider."
        if self.kind == KnowledgeBaseKind.EXTERNAL_RAG:
            if not self.provider:
                problems["provider"] = "An external_rag base needs external-http or e5-http."
            elif self.provider == KnowledgeProvider.EXTERNAL_HTTP and not self.api_url:
                problems["api_url"] = "An external-http base needs api_url."
            elif self.provider == KnowledgeProvider.E5_HTTP and not (
                self.embedding_url and self.embedding_model
            ):
                problems["embedding_url"] = "An e5-http base needs embedding_url and a model."
        if self.embedding_url and not self.embedding_model:
            problems["embedding_model"] = "Name the embedding model."
        for field in ("api_url", "embedding_url"):
            url = getattr(self, field)
            problem = outbound_url_problem(url) if url else ""
            if problem:
                problems[field] = problem
        if problems:
            raise ValidationError(problems)


class KnowledgeDocument(models.Model):
    """One document of a base; its text lives in its chunks."""

    base = models.ForeignKey(KnowledgeBase, on_delete=models.CASCADE, related_name="documents")
    name = models.CharField(max_length=MAX_DOCUMENT_NAME)
    #: ``upload``, ``folder:<path>`` or ``git:<url>#<path>``.
    source = models.CharField(max_length=1000, default="upload")
    content_type = models.CharField(max_length=100, default="text/plain")
    sha256 = models.CharField(max_length=64)
    chars = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["base", "name"]
        constraints = [
            models.UniqueConstraint(fields=["base", "name"], name="knowledge_document_unique_name")
        ]

    def __str__(self) -> str:
        return f"{self.base_id}:{self.name}"


class KnowledgeChunk(models.Model):
    """A slice of a document's text, the unit of search; ``embedding`` is little-endian
    float32 (unit length), or null when the base has no vectors (yet)."""

    document = models.ForeignKey(KnowledgeDocument, on_delete=models.CASCADE, related_name="chunks")
    #: Denormalised from the document, for search.
    base = models.ForeignKey(KnowledgeBase, on_delete=models.CASCADE, related_name="chunks")
    seq = models.PositiveIntegerField()
    text = models.TextField()
    embedding = models.BinaryField(null=True, blank=True)
    #: The ``model@dims`` of ``embedding`` ("" when none).
    embedded_model = models.CharField(max_length=250, blank=True, default="")

    class Meta:
        ordering = ["document", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["document", "seq"], name="knowledge_chunk_unique_seq")
        ]
        indexes = [
            models.Index(fields=["base", "embedded_model"], name="knowledge_chunk_base_model")
        ]

    def __str__(self) -> str:
        return f"{self.document_id}#{self.seq}"


class KnowledgeAccess(models.Model):
    """The access matrix: AI employee ``employee`` may read ``base``."""

    employee = models.CharField(max_length=MAX_NAME)
    base = models.ForeignKey(KnowledgeBase, on_delete=models.CASCADE, related_name="access")
    created_by = models.CharField(max_length=MAX_NAME, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["base", "employee"]
        verbose_name = "knowledge access"
        verbose_name_plural = "knowledge access"
        constraints = [
            models.UniqueConstraint(fields=["employee", "base"], name="knowledge_access_unique")
        ]

    def __str__(self) -> str:
        return f"{self.employee}→{self.base_id}"


class RetrievalTool(models.TextChoices):
    KNOWLEDGE_SEARCH = "knowledge_search", "knowledge_search"
    EXTERNAL_RAG_SEARCH = "external_rag_search", "external_rag_search"


class Retrieval(models.Model):
    """One search as made: who asked, over which bases, what came back (or why nothing)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run_id = models.UUIDField(null=True, blank=True)
    invocation = models.CharField(max_length=200, blank=True, default="")
    chat = models.BooleanField(default=False)
    #: The AI employee that searched ("" for a person's test search).
    employee = models.CharField(max_length=MAX_NAME, blank=True, default="")
    #: The person the work is for, or who searched.
    user = models.CharField(max_length=MAX_NAME, blank=True, default="")
    tool = models.CharField(
        max_length=40, choices=RetrievalTool.choices, default=RetrievalTool.KNOWLEDGE_SEARCH
    )
    query = models.TextField()
    #: The base keys searched (or asked for, on a refusal).
    bases = models.JSONField(default=list, blank=True)
    #: ``[{base, document, chunk, score, source}]`` best first.
    hits = models.JSONField(default=list, blank=True)
    mode = models.CharField(max_length=20, blank=True, default="")
    latency_ms = models.PositiveIntegerField(default=0)
    #: Why the search was refused or failed ("" when it answered).
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["run_id", "created_at"], name="knowledge_retrieval_run")]

    def __str__(self) -> str:
        return f"{self.tool}:{self.query[:40]}"

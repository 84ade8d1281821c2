"""The semantic cache's table (docs/semantic-cache.md): stored answers of runs' read-only model
calls, one pattern's entries found by their exact-match key and a near-enough embedding.

Kept out of ``loops/models.py`` (at its size bound), which imports it.
"""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q


class SemanticCacheEntry(models.Model):
    """One stored model answer. ``key`` hashes what must match exactly (employee, endpoint and
    model, offered tools, response format); an entry past ``expires_at`` is never returned."""

    pattern = models.ForeignKey(
        "loops.LoopPattern", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    key = models.CharField(max_length=64)
    #: The unit-length embedding as little-endian float32.
    embedding = models.BinaryField()
    #: The model step's recorded response (the journal's shape: message, model, endpoint, ...).
    response = models.JSONField()
    hits = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        app_label = "loops"
        indexes = [
            models.Index(fields=["pattern", "key", "expires_at"], name="loops_semcache_lookup"),
            models.Index(fields=["expires_at"], name="loops_semcache_expiry"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(expires_at__gt=F("created_at")), name="loops_semcache_expires_later"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pattern_id}:{self.key[:12]}:{self.id}"

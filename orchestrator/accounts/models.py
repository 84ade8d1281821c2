"""API tokens: hashed at rest, looked up by a visible prefix, revocable and expiring."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.db.models import Q

TOKEN_PREFIX = "lw"  # noqa: S105 - a public marker, not a secret


def hash_secret(secret: str) -> str:
    # Tokens carry 256 bits of entropy, so a plain SHA-256 is enough (no password stretching).
    return hashlib.sha256(secret.encode()).hexdigest()


def generate_token() -> tuple[str, str, str]:
    """Return (full token shown once, lookup prefix, hash of the secret part)."""
    prefix = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return f"{TOKEN_PREFIX}_{prefix}_{secret}", prefix, hash_secret(secret)


class ApiToken(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, default="cli")
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    #: The most tokens (prompt + completion) and the most cost (the endpoints' prices) the
    #: token's chat completions may use per UTC day; null: no quota (docs/openai-endpoint.md).
    daily_token_quota = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="The most tokens (prompt + completion) this token's chat completions may use "
        "per UTC day; null: no quota. Over it, /v1/chat/completions answers 429 quota_exceeded "
        "with Retry-After (the next UTC midnight).",
    )
    daily_cost_quota = models.DecimalField(
        max_digits=12,
        decimal_places=4,
        null=True,
        blank=True,
        help_text="The most cost (the employees' endpoint prices) this token's chat completions "
        "may use per UTC day; null: no quota. Over it, the same 429.",
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(daily_cost_quota__isnull=True) | Q(daily_cost_quota__gte=0),
                name="accounts_token_cost_quota_not_negative",
            ),
        ]

    def __str__(self) -> str:
        return f"{TOKEN_PREFIX}_{self.prefix}_… ({self.user})"

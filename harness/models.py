"""Harness profiles and their versions.

The database holds the invariants: one row per (profile, version), at most one draft per profile
(a partial unique index), and a published version always has its publication time. Writes go
through ``harness.services``; ``HarnessProfileVersion.save`` and ``delete`` additionally refuse to
touch a published row, so nothing (admin, shell, a careless script) rewrites a shipped policy.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q

from orchestrator.errors import Conflict


class VersionStatus(models.TextChoices):
    DRAFT = "draft"
    PUBLISHED = "published"


class PublishedVersionImmutable(Conflict):
    """A write to a published version: published policy never changes."""


class VersionRow(models.Model):
    """A version row that no write touches once it is stored as published: ``save`` and
    ``delete`` refuse (409), whoever calls them. ``status`` and ``version`` are the subclass's
    fields; ``owner_noun`` names what it is a version of in the refusal."""

    owner_noun = "profile"

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self._stored_as_published():
            raise PublishedVersionImmutable(
                f"version {self.version} of this {self.owner_noun} is published and cannot be "  # type: ignore[attr-defined]
                "changed; save a draft instead."
            )
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        if self._stored_as_published():
            raise PublishedVersionImmutable(
                f"version {self.version} of this {self.owner_noun} is published and cannot be "  # type: ignore[attr-defined]
                "deleted."
            )
        return super().delete(*args, **kwargs)

    @property
    def is_published(self) -> bool:
        return bool(self.status == VersionStatus.PUBLISHED)  # type: ignore[attr-defined]

    def _stored_as_published(self) -> bool:
        # Asks the database, not this instance: the row may have been published since it loaded.
        if self._state.adding or self.pk is None:
            return False
        rows = type(self)._default_manager.filter(pk=self.pk)
        return rows.filter(status=VersionStatus.PUBLISHED).exists()  # type: ignore[misc]


class HarnessProfile(models.Model):
    """A policy bundle addressed by a unique tag; ``current_version`` is its published head."""

    tag = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True, default="")
    current_version = models.ForeignKey(
        "HarnessProfileVersion",
        null=True,
        blank=True,
        # The head can only go away together with its profile (the versions cascade).
        on_delete=models.RESTRICT,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tag"]

    def __str__(self) -> str:
        return self.tag


class HarnessProfileVersion(VersionRow):
    """One version of a profile's settings (a :class:`harness.schema.HarnessLayer` as JSON)."""

    profile = models.ForeignKey(HarnessProfile, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    settings = models.JSONField(default=dict, blank=True)
    status = models.CharField(
        max_length=10, choices=VersionStatus.choices, default=VersionStatus.DRAFT
    )
    note = models.CharField(max_length=500, blank=True, default="")
    created_by = models.CharField(max_length=150, blank=True, default="")
    published_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    published_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["profile", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["profile", "version"], name="harness_version_unique"),
            models.UniqueConstraint(
                fields=["profile"],
                condition=Q(status="draft"),
                name="harness_one_draft_per_profile",
            ),
            models.CheckConstraint(
                condition=Q(status__in=[s.value for s in VersionStatus]),
                name="harness_version_status_valid",
            ),
            models.CheckConstraint(condition=Q(version__gte=1), name="harness_version_positive"),
            models.CheckConstraint(
                condition=(
                    Q(status="published", published_at__isnull=False)
                    | Q(status="draft", published_at__isnull=True)
                ),
                name="harness_published_has_time",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.profile_id}@{self.version} ({self.status})"

"""Reads of harness profiles for the API, the admin and the services."""

from __future__ import annotations

from django.db.models import OuterRef, QuerySet, Subquery

from harness.models import HarnessProfile, HarnessProfileVersion, VersionStatus
from orchestrator.errors import NotFound


def profile_list() -> QuerySet[HarnessProfile]:
    """Profiles with their current version and, as ``draft_version``, their open draft's number."""
    drafts = HarnessProfileVersion.objects.filter(
        profile=OuterRef("pk"), status=VersionStatus.DRAFT
    ).values("version")[:1]
    return (
        HarnessProfile.objects.select_related("current_version")
        .annotate(draft_version=Subquery(drafts))
        .order_by("tag")
    )


def profile_get_or_none(tag: str) -> HarnessProfile | None:
    return profile_list().filter(tag=tag).first()


def profile_get(*, tag: str) -> HarnessProfile:
    profile = profile_get_or_none(tag)
    if profile is None:
        raise NotFound(f"No harness profile tagged {tag!r}.")
    return profile


def profile_versions(*, tag: str) -> QuerySet[HarnessProfileVersion]:
    """Versions of a profile, newest first; NotFound if the profile does not exist."""
    return profile_get(tag=tag).versions.order_by("-version")


def profile_open_draft(profile: HarnessProfile) -> HarnessProfileVersion | None:
    return profile.versions.filter(status=VersionStatus.DRAFT).first()

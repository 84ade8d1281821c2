"""Read-only queries of the policy (harness profile) pages."""

from __future__ import annotations

from django.http import Http404

from harness.models import HarnessProfile, HarnessProfileVersion
from harness.selectors import profile_get_or_none, profile_list


def profiles() -> list[HarnessProfile]:
    return list(profile_list())


def published_tags() -> list[str]:
    return [p.tag for p in profile_list() if p.current_version_id is not None]


def profile_detail(tag: str) -> HarnessProfile:
    profile = profile_get_or_none(tag)
    if profile is None:
        raise Http404(f"There is no policy profile {tag!r}.")
    return profile


def profile_versions(profile: HarnessProfile) -> list[HarnessProfileVersion]:
    return list(profile.versions.order_by("-version"))


def profile_version(profile: HarnessProfile, version: int) -> HarnessProfileVersion:
    found = profile.versions.filter(version=version).first()
    if found is None:
        raise Http404(f"Policy profile {profile.tag!r} has no version {version}.")
    return found


def profile_draft(profile: HarnessProfile) -> HarnessProfileVersion | None:
    return profile.versions.filter(status="draft").first()

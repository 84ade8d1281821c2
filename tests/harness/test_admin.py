"""The Django admin keeps the API's rules: services do the writes, published rows stay read-only."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from harness.models import HarnessProfile, HarnessProfileVersion, VersionStatus
from harness.services import profile_save_draft

pytestmark = pytest.mark.django_db

PROFILES = "/admin/harness/harnessprofile"
VERSIONS = "/admin/harness/harnessprofileversion"


def inline_management(profile: HarnessProfile) -> dict[str, Any]:
    count = profile.versions.count()
    return {
        "versions-TOTAL_FORMS": count,
        "versions-INITIAL_FORMS": count,
        "versions-MIN_NUM_FORMS": 0,
        "versions-MAX_NUM_FORMS": 1000,
    }


def test_the_changelists_and_a_seeded_profile_render(admin_client: Client) -> None:
    safe = HarnessProfile.objects.get(tag="safe")
    assert admin_client.get(f"{PROFILES}/").status_code == 200
    assert admin_client.get(f"{VERSIONS}/").status_code == 200
    page = admin_client.get(f"{PROFILES}/{safe.pk}/change/")
    assert page.status_code == 200
    assert b"seeded" in page.content  # the versions inline shows version 1's note


def test_adding_a_profile_goes_through_the_service_and_publishes_version_one(
    admin_client: Client,
) -> None:
    response = admin_client.post(
        f"{PROFILES}/add/",
        {"tag": "team", "description": "d", "settings": json.dumps({"limits": {"maxTokens": 3}})},
    )
    assert response.status_code == 302, response.content
    profile = HarnessProfile.objects.get(tag="team")
    assert profile.current_version is not None
    assert profile.current_version.status == VersionStatus.PUBLISHED
    assert profile.current_version.created_by == "admin"


def test_adding_a_profile_with_invalid_settings_shows_the_problems(admin_client: Client) -> None:
    response = admin_client.post(
        f"{PROFILES}/add/",
        {"tag": "team", "settings": json.dumps({"limits": {"maxTokens": -1}})},
    )
    assert response.status_code == 200
    assert b"/limits/maxTokens" in response.content
    assert not HarnessProfile.objects.filter(tag="team").exists()


def test_changing_a_profile_changes_its_description(admin_client: Client) -> None:
    safe = HarnessProfile.objects.get(tag="safe")
    response = admin_client.post(
        f"{PROFILES}/{safe.pk}/change/", {"description": "new", **inline_management(safe)}
    )
    assert response.status_code == 302, response.content
    safe.refresh_from_db()
    assert safe.description == "new"


def test_seeded_profiles_cannot_be_deleted_from_the_admin(admin_client: Client) -> None:
    safe = HarnessProfile.objects.get(tag="safe")
    assert admin_client.post(f"{PROFILES}/{safe.pk}/delete/", {"post": "yes"}).status_code == 403
    assert HarnessProfile.objects.filter(tag="safe").exists()
    # No bulk actions at all: bulk deletion would skip the per-profile rule.
    assert admin_client.get(f"{PROFILES}/").context["action_form"] is None


def test_a_published_version_is_view_only(admin_client: Client) -> None:
    version = HarnessProfileVersion.objects.get(profile__tag="safe", version=1)
    assert admin_client.get(f"{VERSIONS}/{version.pk}/change/").status_code == 200
    response = admin_client.post(
        f"{VERSIONS}/{version.pk}/change/", {"settings": "{}", "note": "hacked"}
    )
    assert response.status_code == 403
    assert admin_client.post(f"{VERSIONS}/{version.pk}/delete/", {"post": "yes"}).status_code == 403
    version.refresh_from_db()
    assert version.note == "seeded"
    assert version.settings["isolation"]["networkAccess"] == "deny"


def test_adding_a_version_saves_a_draft_and_editing_it_writes_into_it(admin_client: Client) -> None:
    safe = HarnessProfile.objects.get(tag="safe")
    response = admin_client.post(
        f"{VERSIONS}/add/",
        {"profile": safe.pk, "settings": json.dumps({"limits": {"maxTokens": 5}}), "note": "n"},
    )
    assert response.status_code == 302, response.content
    draft = HarnessProfileVersion.objects.get(profile=safe, status=VersionStatus.DRAFT)
    assert (draft.version, draft.settings, draft.created_by) == (
        2,
        {"limits": {"maxTokens": 5}},
        "admin",
    )

    response = admin_client.post(
        f"{VERSIONS}/{draft.pk}/change/",
        {"settings": json.dumps({"limits": {"maxTokens": 6}}), "note": "m"},
    )
    assert response.status_code == 302, response.content
    draft.refresh_from_db()
    assert (draft.settings, draft.note) == ({"limits": {"maxTokens": 6}}, "m")


def test_the_publish_action_publishes_selected_drafts(admin_client: Client) -> None:
    draft = profile_save_draft(tag="default", settings={})
    response = admin_client.post(
        f"{VERSIONS}/", {"action": "publish_drafts", "_selected_action": [draft.pk]}
    )
    assert response.status_code == 302
    draft.refresh_from_db()
    assert draft.status == VersionStatus.PUBLISHED
    assert draft.published_by == "admin"
    assert HarnessProfile.objects.get(tag="default").current_version_id == draft.pk


def test_a_draft_can_be_discarded_from_the_admin(admin_client: Client) -> None:
    draft = profile_save_draft(tag="default", settings={})
    assert admin_client.post(f"{VERSIONS}/{draft.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not HarnessProfileVersion.objects.filter(pk=draft.pk).exists()

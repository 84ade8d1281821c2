"""Profile lifecycle, immutability, resolution and run snapshots, through the services."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction
from pytest_django.fixtures import Settings as SettingsWrapper

from harness.models import (
    HarnessProfile,
    HarnessProfileVersion,
    PublishedVersionImmutable,
    VersionStatus,
)
from harness.schema import settings_problems
from harness.services import (
    ProfileNotFound,
    harness_compile_for,
    harness_snapshot,
    harness_tag_exists,
    platform_settings,
    profile_create,
    profile_delete,
    profile_publish,
    profile_save_draft,
    profile_update,
    profile_version_resolve,
    profile_versions_current,
)
from orchestrator.errors import Conflict, InvalidInput, NotFound

pytestmark = pytest.mark.django_db


def versions(tag: str) -> list[tuple[int, str]]:
    rows = HarnessProfileVersion.objects.filter(profile__tag=tag).order_by("version")
    return [(v.version, v.status) for v in rows]


# --- Seeded profiles ----------------------------------------------------------------------------


@pytest.mark.parametrize("tag", ["default", "safe", "file-heavy"])
def test_the_seeded_profiles_exist_with_a_valid_published_first_version(tag: str) -> None:
    profile = HarnessProfile.objects.get(tag=tag)
    assert profile.current_version is not None
    assert profile.current_version.version == 1
    assert profile.current_version.status == VersionStatus.PUBLISHED
    assert profile.description
    assert settings_problems(profile.current_version.settings) == []


def test_safe_is_read_only_offline_and_takes_few_steps() -> None:
    settings = harness_snapshot(tag="safe")["settings"]
    assert settings["tools"]["allow"] == ["list", "read"]
    assert {"write", "edit"} <= set(settings["tools"]["deny"])
    assert settings["tools"]["trustedPreHandlerTools"] == []
    assert settings["isolation"]["networkAccess"] == "deny"
    assert settings["paths"]["maxFiles"] == 0
    default = harness_snapshot(tag="default")["settings"]
    assert settings["limits"]["recursionLimit"] < default["limits"]["recursionLimit"]
    # Run-level limits are judged with the acting role's snapshot: the verifier's default
    # never refuses a run the seeded maker profiles allowed.
    for maker in (default, harness_snapshot(tag="file-heavy")["settings"]):
        for key in ("timeoutMs", "maxInvocations", "maxToolCalls", "maxTokens", "maxCost"):
            assert settings["limits"][key] >= maker["limits"][key]


def test_file_heavy_requires_a_worktree_and_trusts_file_writes_only() -> None:
    settings = harness_snapshot(tag="file-heavy")["settings"]
    assert settings["isolation"]["requireWorktree"] is True
    assert settings["isolation"]["mode"] == "worktree"
    assert settings["tools"]["trustedPreHandlerTools"] == ["edit", "write"]


def test_no_seeded_profile_names_a_tool_that_does_not_exist() -> None:
    from runtime.tools import builtin_registry

    known = {spec.name for spec in builtin_registry().specs()} | {"bash", "*"}
    for tag in ("default", "safe", "file-heavy"):
        tools = HarnessProfile.objects.get(tag=tag).current_version.settings["tools"]
        named = {*tools["allow"], *tools["ask"], *tools["deny"], *tools["trustedPreHandlerTools"]}
        assert named <= known, (tag, named - known)


def test_the_seeded_profiles_take_the_platforms_memory_spans_and_delegation() -> None:
    for tag in ("default", "safe", "file-heavy"):
        settings = harness_snapshot(tag=tag)["settings"]
        # Memory is built: the platform reads and writes every scope, 20 items, 4,000 chars.
        assert settings["memory"] == {
            "enabled": True,
            "write": True,
            "scopes": ["agent_user", "public", "user"],
            "maxItems": 20,
            "maxChars": 4000,
        }
        # Sub-agents (delegation) are built: the platform's ceiling applies.
        assert settings["delegation"] == {"allowedEmployees": ["*"], "maxDepth": 1, "maxCount": 10}
        assert settings["isolation"]["allowedConnectors"] == []
        # Spans are built: the platform records them, kept 30 days, with inputs and outputs.
        assert settings["observability"] == {
            "enabled": True,
            "tracingRetentionDays": 30,
            "captureInputs": True,
            "captureOutputs": True,
            "redact": [],
            "samplingRate": 1.0,
        }


# --- Creation -----------------------------------------------------------------------------------


def test_creating_a_profile_publishes_its_first_version_at_once(team: HarnessProfile) -> None:
    assert versions("team") == [(1, "published")]
    assert team.current_version is not None
    assert team.current_version.settings == {
        "tools": {"allow": ["read", "write"], "trustedPreHandlerTools": []},
        "limits": {"maxTokens": 1000},
    }
    assert team.current_version.published_at is not None


def test_a_second_profile_with_the_same_tag_is_a_conflict(team: HarnessProfile) -> None:
    with pytest.raises(Conflict, match="already exists"):
        profile_create(tag="team", settings={})
    assert HarnessProfile.objects.filter(tag="team").count() == 1


def test_invalid_settings_create_nothing_and_list_every_problem() -> None:
    bad = {"tools": {"allow": "read"}, "limits": {"maxTokens": -1}}
    with pytest.raises(InvalidInput) as caught:
        profile_create(tag="broken", settings=bad)
    pointers = sorted(e["pointer"] for e in caught.value.extra["errors"])
    assert pointers == ["/settings/limits/maxTokens", "/settings/tools/allow"]
    assert not HarnessProfile.objects.filter(tag="broken").exists()


def test_a_tag_must_be_a_slug() -> None:
    with pytest.raises(InvalidInput):
        profile_create(tag="no spaces", settings={})


# --- Drafts and publishing ----------------------------------------------------------------------


def test_saving_opens_a_draft_and_saving_again_writes_into_the_same_draft(
    team: HarnessProfile,
) -> None:
    first = profile_save_draft(tag="team", settings={"limits": {"maxTokens": 10}}, note="a")
    second = profile_save_draft(tag="team", settings={"limits": {"maxTokens": 20}})
    assert (first.version, second.version) == (2, 2)
    assert second.settings == {"limits": {"maxTokens": 20}}
    assert second.note == "a"
    assert versions("team") == [(1, "published"), (2, "draft")]


def test_publishing_makes_the_draft_current_and_the_next_save_opens_a_new_version(
    team: HarnessProfile,
) -> None:
    profile_save_draft(tag="team", settings={"limits": {"maxTokens": 10}})
    published = profile_publish(tag="team", published_by="root")
    assert published.status == VersionStatus.PUBLISHED
    assert published.published_by == "root"
    team.refresh_from_db()
    assert team.current_version == published
    assert profile_save_draft(tag="team", settings={}).version == 3
    assert versions("team") == [(1, "published"), (2, "published"), (3, "draft")]


def test_publishing_without_an_open_draft_is_a_conflict(team: HarnessProfile) -> None:
    with pytest.raises(Conflict, match="no open draft"):
        profile_publish(tag="team")


def test_publishing_a_version_that_is_not_the_open_draft_is_refused(team: HarnessProfile) -> None:
    profile_save_draft(tag="team", settings={})
    with pytest.raises(Conflict, match="already published"):
        profile_publish(tag="team", version=1)
    with pytest.raises(NotFound):
        profile_publish(tag="team", version=9)
    assert profile_publish(tag="team", version=2).version == 2


def test_writes_to_an_unknown_profile_are_not_found() -> None:
    with pytest.raises(NotFound):
        profile_save_draft(tag="nope", settings={})
    with pytest.raises(NotFound):
        profile_publish(tag="nope")
    with pytest.raises(NotFound):
        profile_update(tag="nope", description="")


def test_updating_a_profile_changes_only_its_description(team: HarnessProfile) -> None:
    profile_update(tag="team", description="new words")
    team.refresh_from_db()
    assert team.description == "new words"
    assert versions("team") == [(1, "published")]


def test_seeded_profiles_cannot_be_deleted_and_others_go_with_their_versions(
    team: HarnessProfile,
) -> None:
    with pytest.raises(Conflict):
        profile_delete(tag="safe")
    profile_save_draft(tag="team", settings={})
    profile_delete(tag="team")
    assert not HarnessProfile.objects.filter(tag="team").exists()
    assert not HarnessProfileVersion.objects.filter(profile_id=team.pk).exists()


# --- Immutability -------------------------------------------------------------------------------


def test_a_published_version_refuses_model_saves_and_deletes(team: HarnessProfile) -> None:
    version = HarnessProfileVersion.objects.get(profile=team, version=1)
    version.settings = {"tools": {"allow": ["*"]}}
    with pytest.raises(PublishedVersionImmutable):
        version.save()
    with pytest.raises(PublishedVersionImmutable):
        version.delete()
    version.refresh_from_db()
    assert version.settings == team.current_version.settings  # type: ignore[union-attr]


def test_a_stale_draft_instance_cannot_overwrite_a_version_published_since(
    team: HarnessProfile,
) -> None:
    stale = profile_save_draft(tag="team", settings={"limits": {"maxTokens": 1}})
    profile_publish(tag="team")
    stale.settings = {"limits": {"maxTokens": 999}}
    with pytest.raises(PublishedVersionImmutable):
        stale.save()
    stale.refresh_from_db()
    assert stale.settings == {"limits": {"maxTokens": 1}}


def test_the_database_refuses_a_second_draft_and_a_duplicate_number(team: HarnessProfile) -> None:
    profile_save_draft(tag="team", settings={})
    with pytest.raises(IntegrityError), transaction.atomic():
        HarnessProfileVersion.objects.create(profile=team, version=3, status=VersionStatus.DRAFT)
    with pytest.raises(IntegrityError), transaction.atomic():
        HarnessProfileVersion.objects.create(
            profile=team, version=1, status=VersionStatus.PUBLISHED, published_at=team.created_at
        )


def test_the_database_refuses_a_published_version_without_a_publication_time(
    team: HarnessProfile,
) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        HarnessProfileVersion.objects.create(profile=team, version=5, status="published")


# --- Resolution ---------------------------------------------------------------------------------


def test_a_tag_resolves_to_the_current_version_and_tag_at_n_to_that_version(
    team: HarnessProfile,
) -> None:
    profile_save_draft(tag="team", settings={})
    profile_publish(tag="team")
    assert profile_version_resolve("team").version == 2
    assert profile_version_resolve("team@1").version == 1
    assert harness_tag_exists("team") and harness_tag_exists("team@2")


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("nope", "No published harness profile tagged 'nope'"),
        ("team@7", "'team' has no version 7"),
        ("team@2", "is a draft"),
        ("team@0", "not a harness reference"),
        ("team@x", "not a harness reference"),
        ("", "not a harness reference"),
    ],
)
def test_unresolvable_references_raise_profile_not_found_naming_them(
    team: HarnessProfile, ref: str, message: str
) -> None:
    profile_save_draft(tag="team", settings={})
    with pytest.raises(ProfileNotFound, match=message):
        profile_version_resolve(ref)
    assert not harness_tag_exists(ref)
    assert issubclass(ProfileNotFound, InvalidInput)


def test_the_current_versions_of_plain_tags_are_read_in_one_query(
    team: HarnessProfile, django_assert_num_queries: Any
) -> None:
    profile_save_draft(tag="team", settings={})
    HarnessProfile.objects.create(tag="unpublished")
    refs = ["team", " safe ", "team@1", "nope", "unpublished", "", "team@x", "default"]
    with django_assert_num_queries(1):
        found = profile_versions_current(refs)
        tags = {ref: (v.profile.tag, v.version, v.settings) for ref, v in found.items()}
    assert set(found) == {"team", " safe ", "default"}
    for ref, (tag, number, settings) in tags.items():
        one = profile_version_resolve(ref)
        assert (tag, number, settings) == (one.profile.tag, one.version, one.settings)
    with django_assert_num_queries(0):
        assert profile_versions_current(["team@1", "bad ref"]) == {}
    # A column the read left out is read when first used, never a default in its place.
    one = profile_version_resolve("team")
    assert found["team"].status == one.status == "published"
    assert (found["team"].published_at, found["team"].pk) == (one.published_at, one.pk)
    assert found["team"].profile.description == one.profile.description


def test_a_compilation_from_versions_read_together_is_the_same_and_reads_no_profile(
    team: HarnessProfile, django_assert_num_queries: Any
) -> None:
    layers: dict[str, Any] = {
        "tag": "team",
        "pattern_layer": {"limits": {"maxTokens": 900}},
        "employee_username": "alice",
        "employee_profile": "safe",
        "employee_layer": {"memory": {"enabled": False}},
    }
    alone = harness_compile_for(**layers).snapshot()
    versions = profile_versions_current(["team", "safe"])
    with django_assert_num_queries(0):
        together = harness_compile_for(**layers, versions=versions).snapshot()
    assert json.dumps(together, sort_keys=True) == json.dumps(alone, sort_keys=True)
    # A ref the versions lack is resolved (or refused) as without them.
    with pytest.raises(ProfileNotFound, match="employee:alice"):
        harness_compile_for(**{**layers, "employee_profile": "nope"}, versions=versions)


# --- Snapshots ----------------------------------------------------------------------------------


def test_a_snapshot_names_its_profile_version_settings_provenance_and_layers() -> None:
    snapshot = harness_snapshot(
        tag="safe",
        pattern_layer={"limits": {"maxTokens": 1000}},
        employee_username="alice",
        employee_layer={"paths": {"deny": ["secrets/**"]}, "memory": {"enabled": False}},
        run_overrides={"limits": {"maxCost": 0.5}},
    )
    assert snapshot["profile"] == {"tag": "safe", "version": 1}
    assert snapshot["layers"] == ["platform", "profile:safe@1", "pattern", "employee:alice", "run"]
    assert snapshot["settings"]["limits"]["maxTokens"] == 1000
    assert snapshot["settings"]["paths"]["deny"] == ["secrets/**"]
    assert snapshot["settings"]["memory"]["enabled"] is False
    assert snapshot["provenance"]["limits.maxTokens"] == "pattern"
    assert snapshot["provenance"]["paths.deny"] == "employee:alice"
    # Stating the "off" the platform already has tightens nothing: the platform stays the source.
    assert snapshot["provenance"]["memory.enabled"] == "employee:alice"  # it switched memory off
    assert snapshot["provenance"]["limits.maxCost"] == "run"
    assert snapshot["provenance"]["tools.deny"] == "profile:safe@1"
    assert json.loads(json.dumps(snapshot)) == snapshot


def test_absent_layers_are_left_out_of_the_snapshot() -> None:
    snapshot = harness_snapshot(tag="default", employee_username="alice")
    assert snapshot["layers"] == ["platform", "profile:default@1"]


def test_an_invalid_layer_is_refused_with_pointers_into_that_layer() -> None:
    with pytest.raises(InvalidInput) as caught:
        harness_snapshot(
            tag="default",
            pattern_layer={"limits": {"maxTokens": "many"}},
        )
    assert [e["pointer"] for e in caught.value.extra["errors"]] == ["/pattern/limits/maxTokens"]
    with pytest.raises(InvalidInput) as caught:
        harness_snapshot(tag="default", employee_layer={"x": 1}, run_overrides={"y": 2})
    assert [e["pointer"] for e in caught.value.extra["errors"]] == ["/employee/harness/x"]


def test_a_layer_with_a_bad_memory_value_is_refused_with_its_pointer() -> None:
    with pytest.raises(InvalidInput) as caught:
        harness_snapshot(tag="default", pattern_layer={"memory": {"maxChars": -3}})
    (error,) = caught.value.extra["errors"]
    assert error["pointer"] == "/pattern/memory/maxChars"
    with pytest.raises(InvalidInput) as caught:
        profile_create(tag="mem", settings={"memory": {"write": "yes"}})
    assert [e["pointer"] for e in caught.value.extra["errors"]] == ["/settings/memory/write"]
    assert not HarnessProfile.objects.filter(tag="mem").exists()


def test_an_employee_profile_is_a_layer_read_as_a_profile_after_the_pattern() -> None:
    snapshot = harness_snapshot(
        tag="file-heavy",
        pattern_layer={"limits": {"maxTokens": 1000}},
        employee_username="alice",
        employee_profile="safe",
        employee_layer={"paths": {"deny": [".env"]}},
    )
    assert snapshot["layers"] == [
        "platform",
        "profile:file-heavy@1",
        "pattern",
        "employee:alice:profile:safe@1",
        "employee:alice",
    ]
    assert snapshot["settings"]["tools"]["allow"] == ["list", "read"]
    assert snapshot["provenance"]["tools.allow"] == "employee:alice:profile:safe@1"
    assert snapshot["provenance"]["paths.deny"] == "employee:alice"
    with pytest.raises(ProfileNotFound) as caught:
        harness_snapshot(tag="default", employee_username="bob", employee_profile="ghost")
    assert [e["pointer"] for e in caught.value.extra["errors"]] == ["/employee/harness_tag"]
    assert "employee:bob" in str(caught.value.detail)


def test_an_unknown_tag_in_a_snapshot_raises_profile_not_found() -> None:
    with pytest.raises(ProfileNotFound, match="'ghost'"):
        harness_snapshot(tag="ghost")


def test_a_snapshot_is_a_deep_copy_that_later_publishes_never_change(team: HarnessProfile) -> None:
    snapshot = harness_snapshot(tag="team", pattern_layer={"paths": {"maxFiles": 50}})
    frozen = copy.deepcopy(snapshot)
    profile_save_draft(tag="team", settings={"limits": {"maxTokens": 5}, "tools": {"deny": ["*"]}})
    profile_publish(tag="team")
    version = HarnessProfileVersion.objects.get(profile=team, version=2)
    assert version.settings["tools"]["deny"] == ["*"]
    assert snapshot == frozen
    assert snapshot["profile"]["version"] == 1
    later = harness_snapshot(tag="team", pattern_layer={"paths": {"maxFiles": 50}})
    assert later["profile"]["version"] == 2
    assert later["settings"]["tools"]["deny"] == ["*"]
    later["settings"]["tools"]["deny"].append("mutated")
    assert harness_snapshot(tag="team")["settings"]["tools"]["deny"] == ["*"]
    assert harness_snapshot(tag="team@1") == harness_snapshot(tag="team@1")


def test_a_profile_without_trusted_tools_trusts_none_even_under_a_permissive_platform() -> None:
    profile_create(tag="loose", settings={"tools": {"allow": ["*"]}})
    snapshot = harness_snapshot(
        tag="loose", pattern_layer={"tools": {"trustedPreHandlerTools": ["write"]}}
    )
    assert snapshot["settings"]["tools"]["trustedPreHandlerTools"] == []
    assert snapshot["provenance"]["tools.trustedPreHandlerTools"] == "profile:loose@1"


# --- Platform ceilings --------------------------------------------------------------------------


def test_the_platform_defaults_are_bounded(settings: SettingsWrapper) -> None:
    platform = platform_settings()
    assert platform.limits.max_tokens == 2_000_000
    assert platform.limits.max_cost == 100


def test_platform_settings_override_single_ceilings_and_bound_every_profile(
    settings: SettingsWrapper,
) -> None:
    settings.LOOPWRIGHT_HARNESS_PLATFORM = {"limits": {"maxTokens": 77}}
    snapshot = harness_snapshot(tag="file-heavy")
    assert snapshot["settings"]["limits"]["maxTokens"] == 77
    assert snapshot["provenance"]["limits.maxTokens"] == "platform"
    assert snapshot["settings"]["limits"]["maxCost"] == 25.0


@pytest.mark.parametrize(
    "override",
    [{"limits": {"maxTokens": -1}}, {"limitz": {}}, {"limits": {"maxTokenz": 1}}],
)
def test_a_broken_platform_override_is_a_configuration_error(
    settings: SettingsWrapper, override: dict[str, Any]
) -> None:
    settings.LOOPWRIGHT_HARNESS_PLATFORM = override
    with pytest.raises(ImproperlyConfigured, match="LOOPWRIGHT_HARNESS_PLATFORM"):
        harness_snapshot(tag="default")

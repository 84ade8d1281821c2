"""The seeded profiles (migration 0002) and the cleaning of old installs (migration 0003)."""

from __future__ import annotations

import copy
import importlib
from typing import Any

import pytest
from django.apps import apps as django_apps

from harness.models import HarnessProfile, HarnessProfileVersion, VersionStatus
from harness.schema import HarnessSettings, settings_problems
from harness.services import harness_snapshot, profile_create, profile_publish, profile_save_draft
from runtime.tools import builtin_registry
from runtime.tools.bash import BASH_SPEC

SEED = importlib.import_module("harness.migrations.0002_seed_profiles")
CLEAN = importlib.import_module("harness.migrations.0003_only_enforced_settings")
cleaned = CLEAN.cleaned

#: The ``safe`` profile as installs migrated before issue 18 stored it (0002 as it was then).
OLD_SAFE: dict[str, Any] = {
    "tools": {
        "allow": ["external_rag_search", "list", "read"],
        "ask": [],
        "deny": ["edit", "write", "dispatch_sub_agent_task"],
        "effects": {"external_rag_search": "external", "read": "read"},
        "trustedPreHandlerTools": [],
    },
    "memory": {"enabled": True, "scopes": ["public"], "maxChars": 4000},
    "delegation": {"allowedEmployees": [], "maxDepth": 0, "maxCount": 0},
    "limits": {"timeoutMs": 600_000, "maxInvocations": 10, "maxToolCalls": 50, "maxCost": 2.0},
    "isolation": {
        "mode": "none",
        "requireWorktree": False,
        "allowedConnectors": [],
        "networkAccess": "deny",
    },
    "observability": {"enabled": True, "tracingRetentionDays": 30, "captureOutputs": False},
}


def existing_tools() -> set[str]:
    return {spec.name for spec in builtin_registry().specs()} | {BASH_SPEC.name}


def named_tools(settings: dict[str, Any]) -> set[str]:
    tools = settings.get("tools", {})
    lists = ("allow", "ask", "deny", "trustedPreHandlerTools")
    return {name for key in lists for name in tools.get(key, []) if name != "*"} | set(
        tools.get("effects", {})
    )


# --- cleaned() ----------------------------------------------------------------------------------


def test_cleaning_drops_what_nothing_enforces_and_keeps_the_rest() -> None:
    before = copy.deepcopy(OLD_SAFE)
    out = cleaned(OLD_SAFE)
    assert before == OLD_SAFE  # the input is untouched
    assert out == {
        "tools": {
            "allow": ["list", "read"],
            "ask": [],
            "deny": ["edit", "write"],
            "effects": {"read": "read"},
            "trustedPreHandlerTools": [],
        },
        # sections and keys already "off" are valid and enforced as they are: they stay
        "delegation": {"allowedEmployees": [], "maxDepth": 0, "maxCount": 0},
        "limits": OLD_SAFE["limits"],
        "isolation": {
            "mode": "none",
            "requireWorktree": False,
            "allowedConnectors": [],
            "networkAccess": "deny",
        },
        "observability": {"captureOutputs": False},
    }
    assert settings_problems(out) == []
    assert out["limits"] is not OLD_SAFE["limits"]


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (None, {}),
        ({}, {}),
        ({"memory": {"enabled": False}}, None),
        ({"memory": {"enabled": True, "maxChars": 0}}, {"memory": {"maxChars": 0}}),
        ({"delegation": {"maxDepth": 2}}, {}),
        ({"isolation": {"allowedConnectors": ["*"]}}, {"isolation": {}}),
        ({"isolation": {"allowedConnectors": []}}, None),
        ({"tools": {"allow": ["*", "external_rag_search"]}}, {"tools": {"allow": ["*"]}}),
        ({"tools": {"ask": ["dispatch_sub_agent_task"]}}, {"tools": {"ask": []}}),
        ({"limits": {"maxTokens": 5}, "paths": {"deny": ["x"]}}, None),
        # shapes the schema would refuse are left for the schema to report
        ({"tools": ["read"], "isolation": "none"}, None),
        ({"tools": {"allow": "read", "effects": []}}, None),
    ],
)
def test_cleaning_is_total_and_idempotent(settings: Any, expected: Any) -> None:
    out = cleaned(settings)
    assert out == (settings if expected is None else expected)
    assert cleaned(out) == out


def test_the_old_seeds_clean_to_valid_settings_naming_only_existing_tools() -> None:
    out = cleaned(OLD_SAFE)
    assert settings_problems(out) == []
    assert named_tools(out) <= existing_tools()
    assert named_tools(OLD_SAFE) - existing_tools() == set(CLEAN.MISSING_TOOLS)


# --- A fresh database ---------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("tag", sorted(SEED.SEEDS))
def test_a_fresh_database_holds_the_seeds_as_version_one_valid_and_naming_existing_tools(
    tag: str,
) -> None:
    profile = HarnessProfile.objects.get(tag=tag)
    assert profile.versions.count() == 1  # 0003 found nothing to clean
    current = profile.current_version
    assert current is not None and (current.version, current.note) == (1, "seeded")
    assert current.settings == SEED.SEEDS[tag]["settings"]
    assert settings_problems(current.settings) == []
    assert named_tools(current.settings) <= existing_tools()
    HarnessSettings.model_validate(harness_snapshot(tag=tag)["settings"])


# --- forwards() on an install migrated before issue 18 ------------------------------------------


def forwards() -> None:
    CLEAN.forwards(django_apps, None)


@pytest.mark.django_db
def test_an_old_install_gets_a_cleaned_published_version_and_keeps_its_history() -> None:
    safe_v1 = HarnessProfileVersion.objects.get(profile__tag="safe", version=1)
    HarnessProfileVersion.objects.filter(pk=safe_v1.pk).update(settings=OLD_SAFE)  # as stored then
    team = profile_create(tag="team", settings={"limits": {"maxTokens": 9}})
    HarnessProfileVersion.objects.filter(pk=team.current_version_id).update(
        settings={"limits": {"maxTokens": 9}, "memory": {"enabled": True}}
    )
    profile_create(tag="tidy", settings={"limits": {"maxTokens": 9}})

    forwards()

    safe = HarnessProfile.objects.get(tag="safe")
    assert safe.current_version is not None
    assert (safe.current_version.version, safe.current_version.status) == (2, "published")
    assert safe.current_version.note == CLEAN.NOTE
    assert safe.current_version.settings == SEED.SEEDS["safe"]["settings"]  # still at its seed
    assert HarnessProfileVersion.objects.get(pk=safe_v1.pk).settings == OLD_SAFE
    team.refresh_from_db()
    assert team.current_version is not None and team.current_version.version == 2
    assert team.current_version.settings == {"limits": {"maxTokens": 9}}
    assert HarnessProfileVersion.objects.filter(profile__tag="tidy").count() == 1
    for profile in HarnessProfile.objects.all():
        assert profile.current_version is not None
        assert settings_problems(profile.current_version.settings) == [], profile.tag
    counts = HarnessProfileVersion.objects.count()
    forwards()  # nothing left to clean
    assert HarnessProfileVersion.objects.count() == counts


@pytest.mark.django_db
def test_a_profile_stating_only_off_values_gets_no_needless_new_version() -> None:
    # Valid settings that state the "off" of features not built yet (as the seeds do for
    # allowedConnectors) are enforced as they are: publishing a copy without them changes nothing.
    off = {
        "memory": {"enabled": False},
        "isolation": {"allowedConnectors": [], "networkAccess": "deny"},
    }
    profile_create(tag="off", settings=off)
    counts = {p.tag: p.versions.count() for p in HarnessProfile.objects.all()}
    forwards()
    assert {p.tag: p.versions.count() for p in HarnessProfile.objects.all()} == counts
    forwards()  # and a second run (a migration run again on a restored copy) adds nothing either
    assert {p.tag: p.versions.count() for p in HarnessProfile.objects.all()} == counts


@pytest.mark.django_db
def test_an_open_draft_is_cleaned_in_place_and_stays_the_newest_version() -> None:
    profile_create(tag="team", settings={"limits": {"maxTokens": 9}})
    team = HarnessProfile.objects.get(tag="team")
    HarnessProfileVersion.objects.filter(pk=team.current_version_id).update(
        settings={"delegation": {"maxCount": 3}, "limits": {"maxTokens": 9}}
    )
    draft = profile_save_draft(tag="team", settings={"limits": {"maxTokens": 5}})
    HarnessProfileVersion.objects.filter(pk=draft.pk).update(
        settings={"limits": {"maxTokens": 5}, "observability": {"enabled": True}}
    )

    forwards()

    draft.refresh_from_db()
    assert (draft.status, draft.settings) == (VersionStatus.DRAFT, {"limits": {"maxTokens": 5}})
    published = HarnessProfileVersion.objects.filter(profile=team, status="published")
    assert draft.version > max(v.version for v in published), [
        (v.version, v.status) for v in team.versions.order_by("version")
    ]
    profile_publish(tag="team")
    team.refresh_from_db()
    assert team.current_version == draft

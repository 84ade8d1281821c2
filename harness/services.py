"""Writes and resolution for harness profiles, and the compiled snapshots runs are pinned to.

Version numbers are allocated while holding the profile row (``SELECT … FOR UPDATE``), so
concurrent saves and publishes on one profile serialise: a save either writes into the open draft
or, after the previous draft shipped, starts the next number; it never writes into a version
that is being published. The unique indexes on (profile, version) and on the single draft back
this up in the database.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from harness.checks import PublishedVersion, publish_checks_run
from harness.compile import (
    CompiledHarness,
    Layer,
    harness_compile,
    layer_from_settings,
    profile_layer,
)
from harness.models import HarnessProfile, HarnessProfileVersion, VersionStatus
from harness.planner import ToolPlan, plan_tools
from harness.schema import DEFAULT_PLATFORM, HarnessSettings, SettingsInvalid, layer_validate
from harness.selectors import profile_get, profile_open_draft
from orchestrator.errors import Conflict, InvalidInput, NotFound
from orchestrator.sql import fetch_all, placeholders
from runtime.types import ToolSpec

SEEDED_TAGS = frozenset({"default", "safe", "file-heavy"})
"""Profiles the data migration creates; patterns default to them, so they cannot be deleted."""

_REF = re.compile(r"^(?P<tag>[-a-zA-Z0-9_]+)(?:@(?P<version>[1-9][0-9]{0,8}))?$")
_TAG = re.compile(r"^[-a-zA-Z0-9_]{1,100}$")


class ProfileNotFound(InvalidInput):
    """A harness reference (``tag`` or ``tag@version``) that names no published version."""

    problem_type = "unknown-harness-profile"
    title = "Unknown harness profile"


# --- Platform layer ---------------------------------------------------------------------------


def platform_settings() -> HarnessSettings:
    """The platform ceilings: ``settings.LOOPWRIGHT_HARNESS_PLATFORM`` over DEFAULT_PLATFORM.

    The override is merged key by key within each section, so an installation can change one
    ceiling without restating the others. A broken override is a configuration error: it raises
    instead of silently falling back to looser defaults.
    """
    override: Mapping[str, Any] = getattr(django_settings, "LOOPWRIGHT_HARNESS_PLATFORM", {})
    merged = {
        section: {**fields, **dict(override.get(section) or {})}
        for section, fields in DEFAULT_PLATFORM.items()
    }
    merged.update({k: v for k, v in override.items() if k not in DEFAULT_PLATFORM})
    try:
        return HarnessSettings.model_validate(merged)
    except ValueError as exc:
        raise ImproperlyConfigured(f"LOOPWRIGHT_HARNESS_PLATFORM is invalid: {exc}") from exc


def platform_layer() -> Layer:
    return layer_from_settings("platform", platform_settings())


# --- Profiles and versions --------------------------------------------------------------------


def layer_stored(data: Any, field: str, label: str = "harness settings") -> dict[str, Any]:
    """Layer settings as they are stored (validated, camelCase, only what they state), or
    InvalidInput whose pointers start at ``/<field>`` and whose title names ``label``."""
    try:
        layer = layer_validate(data, (field,))
    except SettingsInvalid as exc:
        raise InvalidInput(
            f"The {label} have {len(exc.problems)} problem(s).", errors=exc.problems
        ) from exc
    return layer.model_dump(exclude_unset=True)


def _validated_settings(data: Any) -> dict[str, Any]:
    return layer_stored(data, "settings")


#: Names of the profile collection's own actions (``/harness-profiles/<name>``): a profile so
#: tagged could never be addressed, so the tags are refused.
RESERVED_TAGS = frozenset({"compile", "create-profile", "validate"})


def _check_tag(tag: str) -> None:
    if not _TAG.match(tag):
        raise InvalidInput(
            "A tag is 1-100 letters, digits, '-' or '_'.",
            errors=[{"pointer": "/tag", "detail": "Invalid tag.", "code": "invalid"}],
        )
    if tag in RESERVED_TAGS:
        raise InvalidInput(
            f"The tag {tag!r} is reserved (an action of /api/v1/harness-profiles); choose another.",
            errors=[{"pointer": "/tag", "detail": "Reserved tag.", "code": "reserved"}],
        )


def profile_create(
    *, tag: str, settings: Any, description: str = "", created_by: str = ""
) -> HarnessProfile:
    """Create a profile together with its first version, published, in one transaction."""
    _check_tag(tag)
    stored = _validated_settings(settings)
    now = timezone.now()
    try:
        with transaction.atomic():
            profile = HarnessProfile.objects.create(tag=tag, description=description)
            version = HarnessProfileVersion.objects.create(
                profile=profile,
                version=1,
                settings=stored,
                status=VersionStatus.PUBLISHED,
                note="created",
                created_by=created_by,
                published_by=created_by,
                published_at=now,
            )
            profile.current_version = version
            profile.save(update_fields=["current_version", "updated_at"])
    except IntegrityError as exc:
        # The unique tag decides a race between two creations; the loser gets a clear 409.
        raise Conflict(f"A harness profile tagged {tag!r} already exists.") from exc
    return profile


def profile_update(*, tag: str, description: str) -> HarnessProfile:
    """Change what describes a profile; its settings only change through versions."""
    profile = profile_get(tag=tag)
    profile.description = description
    profile.save(update_fields=["description", "updated_at"])
    return profile


def profile_delete(*, tag: str) -> None:
    """Delete a profile and its versions. Runs keep their snapshots; seeded profiles stay."""
    if tag in SEEDED_TAGS:
        raise Conflict(f"The seeded profile {tag!r} cannot be deleted; publish a new version.")
    profile = profile_get(tag=tag)
    profile.delete()


def _lock_profile(tag: str) -> HarnessProfile:
    """The profile row, locked until the transaction ends. Caller must be inside atomic()."""
    profile = HarnessProfile.objects.select_for_update().filter(tag=tag).first()
    if profile is None:
        raise NotFound(f"No harness profile tagged {tag!r}.")
    return profile


def profile_save_draft(
    *, tag: str, settings: Any, note: str | None = None, created_by: str = ""
) -> HarnessProfileVersion:
    """Write settings into the profile's open draft, or open the next version if none is open.

    Holds the profile row lock, so the draft found here cannot be published underneath this
    write and two saves cannot both open a new version.
    """
    stored = _validated_settings(settings)
    with transaction.atomic():
        profile = _lock_profile(tag)
        draft = profile_open_draft(profile)
        if draft is None:
            return _draft_open(profile, stored, note or "", created_by)
        fields: dict[str, Any] = {"settings": stored, "updated_at": timezone.now()}
        if note is not None:
            fields["note"] = note
        updated = HarnessProfileVersion.objects.filter(
            pk=draft.pk, status=VersionStatus.DRAFT
        ).update(**fields)
        if updated != 1:  # cannot happen under the lock; refuse rather than lose the write
            raise Conflict(f"Draft {draft.version} of {tag!r} changed concurrently; save again.")
        draft.refresh_from_db()
        return draft


def _draft_open(
    profile: HarnessProfile, stored: dict[str, Any], note: str, created_by: str
) -> HarnessProfileVersion:
    last = profile.versions.aggregate(last=Max("version"))["last"] or 0
    return HarnessProfileVersion.objects.create(
        profile=profile,
        version=last + 1,
        settings=stored,
        status=VersionStatus.DRAFT,
        note=note,
        created_by=created_by,
    )


def _refuse_publish(profile: HarnessProfile, version: int | None) -> Conflict | NotFound:
    tag = profile.tag
    if version is None:
        return Conflict(f"Profile {tag!r} has no open draft to publish; save a draft first.")
    existing = profile.versions.filter(version=version).first()
    if existing is None:
        return NotFound(f"Profile {tag!r} has no version {version}.")
    if existing.is_published:
        return Conflict(f"Version {version} of {tag!r} is already published.")
    return Conflict(f"Version {version} of {tag!r} is not the open draft.")


def profile_publish(
    *, tag: str, version: int | None = None, published_by: str = ""
) -> HarnessProfileVersion:
    """Publish the open draft (optionally naming it) and make it the profile's current version.

    Under the profile row lock, so a concurrent save either lands before (and is published) or
    after (and opens the next version). The status change is guarded by the expected status.
    """
    with transaction.atomic():
        profile = _lock_profile(tag)
        draft = profile_open_draft(profile)
        if draft is None or (version is not None and draft.version != version):
            raise _refuse_publish(profile, version)
        _validated_settings(draft.settings)  # the schema may have tightened since it was saved
        now = timezone.now()
        updated = HarnessProfileVersion.objects.filter(
            pk=draft.pk, status=VersionStatus.DRAFT
        ).update(
            status=VersionStatus.PUBLISHED,
            published_at=now,
            published_by=published_by,
            updated_at=now,
        )
        if updated != 1:
            raise Conflict(f"Draft {draft.version} of {tag!r} was published concurrently.")
        profile.current_version = draft
        profile.save(update_fields=["current_version", "updated_at"])
        publish_checks_run(PublishedVersion(tag=tag, version=draft.version))  # refusal rolls back
        draft.refresh_from_db()
        return draft


# --- Resolution and compilation ---------------------------------------------------------------


def _parse_ref(ref: str) -> tuple[str, int | None]:
    match = _REF.match(ref.strip())
    if match is None:
        raise ProfileNotFound(f"{ref!r} is not a harness reference ('tag' or 'tag@version').")
    version = match["version"]
    return match["tag"], int(version) if version else None


def profile_version_resolve(ref: str) -> HarnessProfileVersion:
    """The published version ``tag`` (current) or ``tag@N`` names; ProfileNotFound otherwise."""
    tag, number = _parse_ref(ref)
    if number is None:
        profile = HarnessProfile.objects.select_related("current_version").filter(tag=tag).first()
        if profile is None or profile.current_version is None:
            raise ProfileNotFound(f"No published harness profile tagged {tag!r}.")
        current = profile.current_version
        current.profile = profile  # already at hand: no second query for it
        return current
    found = (
        HarnessProfileVersion.objects.select_related("profile")
        .filter(profile__tag=tag, version=number)
        .first()
    )
    if found is None:
        raise ProfileNotFound(f"Harness profile {tag!r} has no version {number}.")
    if not found.is_published:
        raise ProfileNotFound(f"Version {number} of {tag!r} is a draft; publish it first.")
    return found


def profile_versions_current(refs: Iterable[str]) -> dict[str, HarnessProfileVersion]:
    """By ref, the current published version of each plain ``tag`` among ``refs``, in one
    query. A ``tag@N`` ref and one naming no published version are left out: pass them to
    :func:`profile_version_resolve`, which answers or refuses them."""
    tags: dict[str, str] = {}
    for ref in refs:
        match = _REF.match(ref.strip())
        if match is not None and match["version"] is None:
            tags[ref] = match["tag"]
    if not tags:
        return {}
    wanted = sorted(set(tags.values()))
    current = {row[1]: row for row in fetch_all(_current_versions_sql(len(wanted)), wanted)}
    found: dict[str, HarnessProfileVersion] = {}
    for ref, tag in tags.items():
        if tag in current:
            found[ref] = _current_version(*current[tag])
    return found


def _current_versions_sql(count: int) -> str:
    """The profiles of ``count`` tags with their current versions, in one plain read."""
    profile, version = HarnessProfile._meta.db_table, HarnessProfileVersion._meta.db_table
    tags = placeholders(range(count))
    return (
        f"SELECT p.id, p.tag, v.id, v.version, v.settings, v.status FROM {profile} p "  # noqa: S608 (table names)
        f"JOIN {version} v ON v.id = p.current_version_id WHERE p.tag IN ({tags})"
    )


def _current_version(
    profile_id: int, tag: str, version_id: int, number: int, settings: Any, status: str
) -> HarnessProfileVersion:
    """The version as the ORM loads it with only the columns a compile reads (any other is
    deferred: read when first used), its profile attached."""
    alias = DEFAULT_DB_ALIAS
    decoded = json.loads(settings) if isinstance(settings, str | bytes) else settings  # jsonb: text
    version = HarnessProfileVersion.from_db(
        alias,
        ["id", "profile_id", "version", "settings", "status"],
        [version_id, profile_id, number, decoded, status],
    )
    version.profile = HarnessProfile.from_db(
        alias, ["id", "tag", "current_version_id"], [profile_id, tag, version_id]
    )
    return version


def harness_tag_exists(tag: str) -> bool:
    """Whether ``tag`` (or ``tag@version``) names a published profile version."""
    try:
        profile_version_resolve(tag)
    except ProfileNotFound:
        return False
    return True


def _layer(name: str, data: Any, prefix: Sequence[str], *, profile: bool = False) -> Layer:
    try:
        settings = layer_validate(data, prefix)
    except SettingsInvalid as exc:
        raise InvalidInput(
            f"The {name} harness layer has {len(exc.problems)} problem(s).", errors=exc.problems
        ) from exc
    return profile_layer(name, settings) if profile else layer_from_settings(name, settings)


@dataclass(frozen=True)
class HarnessCompilation:
    """A compiled harness and the profile version it was compiled from."""

    tag: str
    version: int
    compiled: CompiledHarness

    def snapshot(self) -> dict[str, Any]:
        """Fresh JSON data (shares nothing with any model row) to pin on a run."""
        return {
            "profile": {"tag": self.tag, "version": self.version},
            "settings": self.compiled.settings_dict(),
            "provenance": dict(self.compiled.provenance),
            "layers": list(self.compiled.layers),
        }


def harness_compile_for(
    *,
    tag: str,
    pattern_layer: Mapping[str, Any] | None = None,
    employee_username: str | None = None,
    employee_profile: str | None = None,
    employee_layer: Mapping[str, Any] | None = None,
    run_overrides: Mapping[str, Any] | None = None,
    versions: Mapping[str, HarnessProfileVersion] | None = None,
) -> HarnessCompilation:
    """Stack platform → profile → pattern → employee → run and compile. Absent layers are left out.

    The employee contributes up to two layers: the published profile ``employee_profile`` names
    (``employee:<username>:profile:<tag>@<N>``, read as a profile: omitting trusted tools trusts
    none) and then its inline settings (``employee:<username>``). Invalid layers raise
    InvalidInput whose pointers follow the compile API's body (``/pattern/...``,
    ``/employee/harness/...``, ``/overrides/...``).

    ``versions``: profile versions already read by ref (:func:`profile_versions_current`); a
    ref not in it is resolved here, so the compilation is the same either way.
    """
    versions = versions or {}
    version = versions.get(tag) or profile_version_resolve(tag)
    profile_tag = version.profile.tag
    profile_name = f"profile:{profile_tag}@{version.version}"
    layers = [platform_layer(), _layer(profile_name, version.settings, ("profile",), profile=True)]
    if pattern_layer is not None:
        layers.append(_layer("pattern", pattern_layer, ("pattern",)))
    employee_name = f"employee:{employee_username}" if employee_username else "employee"
    if employee_profile:
        try:
            own = versions.get(employee_profile) or profile_version_resolve(employee_profile)
        except ProfileNotFound as exc:
            problem = {"pointer": "/employee/harness_tag", "detail": exc.detail, "code": "invalid"}
            detail = f"The harness profile of {employee_name}: {exc.detail}"
            raise ProfileNotFound(detail, errors=[problem]) from exc
        own_name = f"{employee_name}:profile:{own.profile.tag}@{own.version}"
        layers.append(_layer(own_name, own.settings, ("employee", "harness_tag"), profile=True))
    if employee_layer is not None:
        layers.append(_layer(employee_name, employee_layer, ("employee", "harness")))
    if run_overrides is not None:
        layers.append(_layer("run", run_overrides, ("overrides",)))
    return HarnessCompilation(profile_tag, version.version, harness_compile(layers))


def harness_snapshot(
    *,
    tag: str,
    pattern_layer: dict[str, Any] | None = None,
    employee_username: str | None = None,
    employee_profile: str | None = None,
    employee_layer: dict[str, Any] | None = None,
    run_overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The compiled harness of one role, as JSON data the run keeps for its whole life.

    ``{"profile": {"tag", "version"}, "settings", "provenance", "layers"}``. The dict is built
    fresh, so later publishes (or edits of the returned dict) never reach another snapshot.
    Raises ProfileNotFound for an unknown tag and InvalidInput for an invalid layer.
    """
    return harness_compile_for(
        tag=tag,
        pattern_layer=pattern_layer,
        employee_username=employee_username,
        employee_profile=employee_profile,
        employee_layer=employee_layer,
        run_overrides=run_overrides,
    ).snapshot()


def harness_preview(
    *,
    tag: str,
    pattern_layer: Mapping[str, Any] | None = None,
    employee_username: str | None = None,
    employee_profile: str | None = None,
    employee_layer: Mapping[str, Any] | None = None,
    run_overrides: Mapping[str, Any] | None = None,
    tools: Sequence[ToolSpec] = (),
) -> tuple[HarnessCompilation, ToolPlan]:
    """What a role would run under, with the tool plan for ``tools`` (the compile API)."""
    compilation = harness_compile_for(
        tag=tag,
        pattern_layer=pattern_layer,
        employee_username=employee_username,
        employee_profile=employee_profile,
        employee_layer=employee_layer,
        run_overrides=run_overrides,
    )
    try:
        plan = plan_tools(compilation.compiled, tools)
    except ValueError as exc:  # duplicate tool names
        problem = {"pointer": "/tools", "detail": str(exc), "code": "invalid"}
        raise InvalidInput(str(exc), errors=[problem]) from exc
    return compilation, plan

"""Publish, for every profile, a version without the settings nothing enforces (issue 18).

Memory, delegation and observability are not built yet and ``isolation.allowedConnectors``
has no connectors to govern, so the schema now accepts only their "off" values; the seeded
``safe`` profile named ``external_rag_search``, a tool that does not exist. A profile whose
current version holds any of that gets a new published version without it (its history stays
as it was); an open draft is cleaned in place and stays the newest version. A seeded profile still at its seeded version 1
gets the seeded settings of ``0002`` as they now stand instead (docs/harness.md explains them).
"""

import copy
import importlib

from django.db import migrations
from django.db.models import Max
from django.utils import timezone

NOT_BUILT_SECTIONS = ("memory", "delegation", "observability")
MISSING_TOOLS = frozenset({"external_rag_search", "dispatch_sub_agent_task"})
NOTE = "settings nothing enforced were removed (memory, delegation, observability, connectors)"


OFF = {
    "enabled": False,
    "scopes": [],
    "maxChars": 0,
    "allowedEmployees": [],
    "maxDepth": 0,
    "maxCount": 0,
    "tracingRetentionDays": 0,
    "captureInputs": False,
    "captureOutputs": False,
}


def cleaned(settings):
    """The settings without what nothing enforces (a new dict; the input is untouched).

    Only values asking for more than "off" go, so settings already valid come back equal."""
    out = copy.deepcopy(settings or {})
    for name in NOT_BUILT_SECTIONS:
        section = out.get(name)
        if not isinstance(section, dict):
            continue
        for key in [k for k, v in section.items() if OFF.get(k, object()) != v]:
            del section[key]
        if not section:
            del out[name]
    isolation = out.get("isolation")
    if isinstance(isolation, dict) and isolation.get("allowedConnectors", []) != []:
        del isolation["allowedConnectors"]
    tools = out.get("tools")
    if isinstance(tools, dict):
        for key in ("allow", "ask", "deny", "trustedPreHandlerTools"):
            if isinstance(tools.get(key), list):
                tools[key] = [name for name in tools[key] if name not in MISSING_TOOLS]
        if isinstance(tools.get("effects"), dict):
            for name in MISSING_TOOLS:
                tools["effects"].pop(name, None)
    return out


def forwards(apps, schema_editor):
    profile_model = apps.get_model("harness", "HarnessProfile")
    version_model = apps.get_model("harness", "HarnessProfileVersion")
    now = timezone.now()
    for draft in version_model.objects.filter(status="draft"):
        settings = cleaned(draft.settings)
        if settings != draft.settings:
            version_model.objects.filter(pk=draft.pk).update(settings=settings, updated_at=now)
    seeds = importlib.import_module("harness.migrations.0002_seed_profiles").SEEDS
    for profile in profile_model.objects.exclude(current_version=None):
        current = version_model.objects.get(pk=profile.current_version_id)
        settings = cleaned(current.settings)
        if profile.tag in seeds and current.version == 1 and current.note == "seeded":
            settings = copy.deepcopy(seeds[profile.tag]["settings"])
        if settings == current.settings:
            continue
        last = version_model.objects.filter(profile=profile).aggregate(m=Max("version"))["m"]
        number = last + 1
        draft = version_model.objects.filter(profile=profile, status="draft").first()
        if draft is not None:
            # The open draft stays the newest version: it moves up one, the cleaned version
            # takes its number.
            number = draft.version
            version_model.objects.filter(pk=draft.pk).update(version=last + 1)
        version = version_model.objects.create(
            profile=profile,
            version=number,
            settings=settings,
            status="published",
            note=NOTE,
            created_by="system",
            published_by="system",
            published_at=now,
        )
        profile_model.objects.filter(pk=profile.pk).update(current_version=version)


class Migration(migrations.Migration):
    dependencies = [("harness", "0002_seed_profiles")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]

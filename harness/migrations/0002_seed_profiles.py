"""Seed the profiles every installation starts with: default, safe and file-heavy.

The settings are written out here (not imported); later changes to a seeded profile are new
versions. docs/harness.md explains each choice. Tool names are the builtin tools of
runtime/tools (read, list, write, edit, bash). Sections whose feature is not built yet (memory,
delegation, observability) are left out: the platform keeps them off. (Installations migrated
before issue 18 got other values here; 0003 publishes a version without them.)
"""

from django.db import migrations
from django.utils import timezone

SEEDS = {
    "default": {
        "description": (
            "General-purpose roles: every tool is offered, reads run freely, every write or "
            "external action waits for a human. Moderate limits."
        ),
        "settings": {
            "tools": {
                "allow": ["*"],
                "ask": [],
                "deny": [],
                "effects": {},
                "trustedPreHandlerTools": [],
            },
            "limits": {
                "timeoutMs": 1_800_000,
                "recursionLimit": 25,
                "maxInvocations": 50,
                "maxToolCalls": 200,
                "maxTokens": 500_000,
                "maxCost": 10.0,
            },
            "paths": {"deny": []},
            "isolation": {
                "mode": "none",
                "requireWorktree": False,
                "allowedConnectors": [],
                "networkAccess": "restricted",
                "allowedHosts": [],
            },
        },
    },
    "safe": {
        "description": (
            "Verifiers and untrusted work: read-only tools, file writes denied, no network, "
            "few model steps per invocation."
        ),
        "settings": {
            "tools": {
                "allow": ["list", "read"],
                "ask": [],
                "deny": ["edit", "write"],
                "effects": {},
                "trustedPreHandlerTools": [],
            },
            "limits": {
                "timeoutMs": 3_600_000,
                "recursionLimit": 12,
                "maxInvocations": 100,
                "maxToolCalls": 1000,
                "maxTokens": 1_500_000,
                "maxCost": 25.0,
            },
            "paths": {"deny": [], "maxFiles": 0},
            "isolation": {
                "mode": "none",
                "requireWorktree": False,
                "allowedConnectors": [],
                "networkAccess": "deny",
                "allowedHosts": [],
            },
        },
    },
    "file-heavy": {
        "description": (
            "Makers that edit many files: runs in its own git worktree (required), file writes "
            "inside it need no approval (at autonomy L2 or L3), larger limits."
        ),
        "settings": {
            "tools": {
                "allow": ["*"],
                "ask": [],
                "deny": [],
                "effects": {},
                "trustedPreHandlerTools": ["edit", "write"],
            },
            "limits": {
                "timeoutMs": 3_600_000,
                "recursionLimit": 50,
                "maxInvocations": 100,
                "maxToolCalls": 1000,
                "maxTokens": 1_500_000,
                "maxCost": 25.0,
            },
            "paths": {"deny": []},
            "isolation": {
                "mode": "worktree",
                "requireWorktree": True,
                "allowedConnectors": [],
                "networkAccess": "restricted",
                "allowedHosts": [],
            },
        },
    },
}


def seed(apps, schema_editor):
    profile_model = apps.get_model("harness", "HarnessProfile")
    version_model = apps.get_model("harness", "HarnessProfileVersion")
    now = timezone.now()
    for tag, seed_data in SEEDS.items():
        if profile_model.objects.filter(tag=tag).exists():
            continue
        profile = profile_model.objects.create(tag=tag, description=seed_data["description"])
        version = version_model.objects.create(
            profile=profile,
            version=1,
            settings=seed_data["settings"],
            status="published",
            note="seeded",
            created_by="system",
            published_by="system",
            published_at=now,
        )
        profile.current_version = version
        profile.save(update_fields=["current_version"])


def unseed(apps, schema_editor):
    profile_model = apps.get_model("harness", "HarnessProfile")
    profile_model.objects.filter(tag__in=list(SEEDS)).delete()


class Migration(migrations.Migration):
    dependencies = [("harness", "0001_initial")]

    operations = [migrations.RunPython(seed, unseed)]

"""Seed the profiles every installation starts with: default, safe and file-heavy.

The settings are written out here (not imported) so this migration stays what it was when it
ran; later changes to a seeded profile are new versions. docs/harness.md explains each choice.
Tool names are the builtin tools of runtime/tools (read, list, write, edit) and the
knowledge search tool external_rag_search.
"""

from django.db import migrations
from django.utils import timezone

ALL_SCOPES = ["agent_user", "public", "user"]

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
            "memory": {"enabled": True, "scopes": ALL_SCOPES, "maxChars": 8000},
            "delegation": {"allowedEmployees": ["*"], "maxDepth": 1, "maxCount": 5},
            "limits": {
                "timeoutMs": 1_800_000,
                "recursionLimit": 25,
                "maxInvocations": 50,
                "maxToolCalls": 200,
                "maxTokens": 500_000,
                "maxCost": 10.0,
            },
            "isolation": {
                "mode": "none",
                "requireWorktree": False,
                "allowedConnectors": ["*"],
                "networkAccess": "restricted",
            },
            "observability": {
                "enabled": True,
                "tracingRetentionDays": 30,
                "captureInputs": True,
                "captureOutputs": True,
            },
        },
    },
    "safe": {
        "description": (
            "Verifiers and untrusted work: read-only tools, file writes denied, no delegation, "
            "no network, no connectors, tight limits."
        ),
        "settings": {
            "tools": {
                "allow": ["external_rag_search", "list", "read"],
                "ask": [],
                "deny": ["edit", "write"],
                "effects": {},
                "trustedPreHandlerTools": [],
            },
            "memory": {"enabled": True, "scopes": ["public"], "maxChars": 4000},
            "delegation": {"allowedEmployees": [], "maxDepth": 0, "maxCount": 0},
            "limits": {
                "timeoutMs": 600_000,
                "recursionLimit": 12,
                "maxInvocations": 10,
                "maxToolCalls": 50,
                "maxTokens": 200_000,
                "maxCost": 2.0,
            },
            "isolation": {
                "mode": "none",
                "requireWorktree": False,
                "allowedConnectors": [],
                "networkAccess": "deny",
            },
            "observability": {
                "enabled": True,
                "tracingRetentionDays": 90,
                "captureInputs": True,
                "captureOutputs": True,
            },
        },
    },
    "file-heavy": {
        "description": (
            "Makers that edit many files: runs in its own git worktree (required), file writes "
            "inside it need no approval, larger limits, file contents kept out of traces."
        ),
        "settings": {
            "tools": {
                "allow": ["*"],
                "ask": [],
                "deny": [],
                "effects": {},
                "trustedPreHandlerTools": ["edit", "write"],
            },
            "memory": {"enabled": True, "scopes": ALL_SCOPES, "maxChars": 16000},
            "delegation": {"allowedEmployees": ["*"], "maxDepth": 1, "maxCount": 10},
            "limits": {
                "timeoutMs": 3_600_000,
                "recursionLimit": 50,
                "maxInvocations": 100,
                "maxToolCalls": 1000,
                "maxTokens": 1_500_000,
                "maxCost": 25.0,
            },
            "isolation": {
                "mode": "worktree",
                "requireWorktree": True,
                "allowedConnectors": ["*"],
                "networkAccess": "restricted",
            },
            "observability": {
                "enabled": True,
                "tracingRetentionDays": 30,
                "captureInputs": True,
                "captureOutputs": False,
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

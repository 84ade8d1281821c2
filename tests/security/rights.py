"""The rights table of the authorization matrix (tests/security/test_authorization_matrix.py):
who may call each route, by method."""

from __future__ import annotations

# --- the rights table ----------------------------------------------------------------------------
# Roles (orchestrator/accounts/roles.py): viewer reads; approver reads and decides approvals;
# operator reads, triggers runs, acts on runs (pause, resume, cancel, escalate, accept, retry) and
# manages patterns, AI employees, model endpoints and delivers events; admin does everything,
# including policy (harness) profiles and event keys. Roles are cumulative only for admin: an
# operator is not an approver (unless a pattern's policy lists them) and an approver is not an
# operator.
PERSONA_ORDER = ("anonymous", "outsider", "viewer", "approver", "operator", "admin")
PUBLIC, VIEWER, APPROVER, OPERATOR, ADMIN, NOBODY, WRITE = (
    "public", "viewer", "approver", "operator", "admin", "nobody", "write",
)  # fmt: skip
#: Any valid API token, with or without a role: the OpenAI-compatible endpoint, where grants per
#: employee decide what a caller may use (docs/openai-endpoint.md).
TOKEN = "token"
#: Who holds each right. NOBODY: the method is not offered (or only to Django staff, which no
#: persona is): everybody is refused. WRITE: the default for an unsafe method of a route this
#: table does not know: anyone without a role and viewers are refused, the others unchecked.
HOLDERS: dict[str, frozenset[str]] = {
    PUBLIC: frozenset(PERSONA_ORDER),
    VIEWER: frozenset({"viewer", "approver", "operator", "admin"}),
    APPROVER: frozenset({"approver", "admin"}),
    OPERATOR: frozenset({"operator", "admin"}),
    ADMIN: frozenset({"admin"}),
    NOBODY: frozenset(),
    TOKEN: frozenset(PERSONA_ORDER) - {"anonymous"},
}
READ = {"GET": VIEWER}
RIGHTS: dict[str, dict[str, str]] = {
    **{probe: {"GET": PUBLIC} for probe in ("healthz", "readyz", "metrics")},  # metrics: no token
    "schema": {"GET": PUBLIC},
    "favicon": {"GET": PUBLIC},
    "api-docs": {"GET": PUBLIC},
    "api-redoc": {"GET": PUBLIC},
    # the OpenAI-compatible endpoint: any token; grants per employee decide the rest
    "openai-models": {"GET": TOKEN},
    "openai-model": {"GET": TOKEN},
    "openai-chat-completions": {"POST": TOKEN},
    "employee-grant-list": {**READ, "POST": ADMIN},
    "employee-grant-detail": {**READ, "DELETE": ADMIN},
    "chat-completion-list": READ,
    "chat-completion-detail": READ,
    "employee-guardrails": {**READ, "PUT": ADMIN},
    # API tokens: admins only (never the secrets); only the daily quotas are writable
    "api-token-list": {"GET": ADMIN, "POST": ADMIN},
    "api-token-detail": {"GET": ADMIN, "PATCH": ADMIN},
    "api-token-revoke": {"POST": ADMIN},
    "ui:api-tokens": {"GET": ADMIN, "POST": ADMIN},
    "ui:api-token-revoke": {"GET": ADMIN, "POST": ADMIN},
    # patterns and runs
    "pattern-list": {**READ, "POST": OPERATOR},
    "pattern-detail": {**READ, "PUT": OPERATOR, "PATCH": OPERATOR, "DELETE": OPERATOR},
    "pattern-trigger": {"POST": OPERATOR},
    "pattern-harness-preview": {"POST": VIEWER},  # a preview is a read, like compile
    "pattern-schedule": READ,
    "run-list": READ,
    "run-detail": READ,
    "run-events": READ,
    "run-steps": READ,
    "run-artifacts": READ,
    "run-spans": READ,
    **{f"run-{a}": {"POST": OPERATOR} for a in ("pause", "resume", "cancel", "escalate")},
    "run-accept": {"POST": OPERATOR},
    "run-retry": {"POST": OPERATOR},
    "run-budget": {"POST": OPERATOR},
    # approvals
    "approval-list": READ,
    "approval-detail": READ,
    "approval-decide": {"POST": APPROVER},
    # triggers
    "event-key-list": {"GET": ADMIN, "POST": ADMIN},
    "event-key-detail": {"GET": ADMIN, "PUT": ADMIN, "PATCH": ADMIN, "DELETE": ADMIN},
    "event-key-rotate": {"POST": ADMIN},
    "event-deliver": {"POST": OPERATOR},
    # policy profiles: previews are reads
    "harness-profile-list": {**READ, "POST": ADMIN},
    "harness-profile-create-profile": {"POST": ADMIN},
    "harness-profile-validate": {"POST": VIEWER},
    "harness-profile-compile": {"POST": VIEWER},
    "harness-profile-detail": {**READ, "PUT": ADMIN, "PATCH": ADMIN, "DELETE": ADMIN},
    "harness-profile-publish": {"POST": ADMIN},
    "harness-profile-save-draft": {"POST": ADMIN},
    "harness-profile-versions": READ,
    # instructions: everyone reads, admins write (docs/instructions.md)
    "instruction-list": {**READ, "POST": ADMIN},
    "instruction-detail": {**READ, "PATCH": ADMIN, "DELETE": ADMIN},
    "instruction-versions": READ,
    "instruction-version": READ,
    "instruction-draft": {"PUT": ADMIN},
    "instruction-publish": {"POST": ADMIN},
    "instruction-diff": READ,
    "instruction-usage": READ,
    # agents
    "model-endpoint-list": {**READ, "POST": OPERATOR},
    "model-endpoint-detail": {**READ, "PUT": OPERATOR, "PATCH": OPERATOR, "DELETE": OPERATOR},
    "model-alias-list": {**READ, "POST": OPERATOR},
    "model-alias-detail": {**READ, "PUT": OPERATOR, "PATCH": OPERATOR, "DELETE": OPERATOR},
    "employee-list": {**READ, "POST": OPERATOR},
    "employee-detail": {**READ, "PUT": OPERATOR, "PATCH": OPERATOR, "DELETE": OPERATOR},
    # Django's admin: only its login and logout are for everyone (no persona is staff)
    "admin:login": {"GET": PUBLIC, "POST": PUBLIC},
    "admin:logout": {"GET": PUBLIC, "POST": PUBLIC},
    # the UI: pages are reads; forms name the role their POST needs
    "ui:login": {"GET": PUBLIC, "POST": PUBLIC},
    "ui:logout": {"POST": PUBLIC},
    **{
        f"ui:{page}": READ
        for page in (
            "monitor",
            "run",
            "patterns",
            "pattern",
            "policies",
            "policy",
            "policy-version",
            "policy-diff",
            "policy-compile",
            "employees",
            "employee",
            "endpoint",
            "stream-runs",
            "stream-run",
            "json-schema",
        )
    },
    "ui:run-action": {"POST": OPERATOR},
    "ui:run-retry": {"POST": OPERATOR},
    "ui:pattern-create": {"GET": OPERATOR, "POST": OPERATOR},
    # the Git import page: operators, as gitListSkills / gitSyncSkills (the preview reaches out)
    "ui:skill-import": {"GET": OPERATOR, "POST": OPERATOR},
    "ui:pattern-edit": {"GET": OPERATOR, "POST": OPERATOR},
    "ui:pattern-trigger": {"GET": OPERATOR, "POST": OPERATOR},
    "ui:policy-draft": {"GET": ADMIN, "POST": ADMIN},
    "ui:policy-publish": {"POST": ADMIN},
    "ui:instructions": {"GET": VIEWER, "POST": ADMIN},
    "ui:gateway": {"GET": VIEWER, "POST": OPERATOR},
    "ui:gateway-alias-delete": {"POST": OPERATOR},
    "ui:instruction": READ,
    "ui:instruction-draft": {"POST": ADMIN},
    "ui:instruction-publish": {"POST": ADMIN},
    # connectors: everyone reads, admins register (their tools reach outside, with secrets)
    "ui:connectors": {"GET": VIEWER, "POST": ADMIN},
    "ui:connector": READ,
    "ui:connector-refresh": {"POST": ADMIN},
    "ui:a2a-agents": {"GET": VIEWER, "POST": ADMIN},
    "ui:a2a-agent": READ,
    "ui:a2a-agent-refresh": {"POST": ADMIN},
    # agent memory: everyone reads, operators edit (docs/memory.md)
    "ui:memory": READ,
    "ui:memory-item": READ,
    "ui:memory-edit": {"POST": OPERATOR},
    "ui:memory-delete": {"POST": OPERATOR},
    "memory-list": {**READ, "POST": OPERATOR},
    "memory-detail": {**READ, "PATCH": OPERATOR, "DELETE": OPERATOR},
    "memory-uses": READ,
    # knowledge bases: everyone reads, operators write (docs/knowledge.md)
    "ui:knowledge": READ,
    "ui:knowledge-base": READ,
    "ui:knowledge-retrievals": READ,
    "ui:knowledge-access": {"GET": VIEWER, "POST": OPERATOR},
    "ui:knowledge-upload": {"POST": OPERATOR},
    "ui:knowledge-search": {"POST": OPERATOR},
    # skill snapshots: operators export (every program and file) and import (docs/skills.md)
    "skill-snapshot": {"GET": OPERATOR, "POST": OPERATOR},
    # skills directories: everyone reads, operators write and sync (docs/skill-directories.md)
    "skill-directory-list": {**READ, "POST": OPERATOR},
    "skill-directory-detail": {**READ, "PATCH": OPERATOR, "DELETE": OPERATOR},
    "skill-directory-sync": {"POST": OPERATOR},
    # skill versions and registry install (docs/skills.md): everyone reads the chain, operators
    # roll back and install, as they edit skills
    "skill-versions": READ,
    "skill-rollback": {"POST": OPERATOR},
    "skill-registry-list": {"POST": OPERATOR},
    "skill-registry-install": {"POST": OPERATOR},
    "ui:skill-rollback": {"POST": OPERATOR},
    # a skill's package environment (docs/skills.md): everyone reads; operators build it
    # (initEnv) and clear it (clearStorage), as they edit skills
    "skill-env": {**READ, "POST": OPERATOR, "DELETE": OPERATOR},
    "ui:skill-env-build": {"POST": OPERATOR},
    "ui:skill-env-clear": {"POST": OPERATOR},
    "ui:skill-review": {"POST": OPERATOR},
    "mcp-server-list": {**READ, "POST": ADMIN},
    "mcp-server-detail": {**READ, "PUT": ADMIN, "PATCH": ADMIN, "DELETE": ADMIN},
    "mcp-server-refresh": {"POST": ADMIN},
    "a2a-agent-list": {**READ, "POST": ADMIN},
    "a2a-agent-detail": {**READ, "PUT": ADMIN, "PATCH": ADMIN, "DELETE": ADMIN},
    "a2a-agent-refresh": {"POST": ADMIN},
}

"""Routes of the operator UI (mounted at "/"). Every view is guarded in ``frontend.access``."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path, re_path

from frontend import streams
from frontend.views import (
    a2a_agents,
    agents,
    api_tokens,
    approvals,
    connectors,
    memory,
    metrics,
    patterns,
    policies,
    runs,
    schemas,
    skill_import,
    skill_snapshot,
    skills,
)
from frontend.views import gateway as gateway_pages
from frontend.views import instructions as instruction_pages
from frontend.views import knowledge as knowledge_pages
from frontend.views import skill_env as skill_env_pages
from frontend.views import skill_versions as skill_version_pages

app_name = "ui"
_ACTIONS = "pause|resume|cancel|escalate|accept"

urlpatterns = [
    path("", runs.monitor, name="monitor"),
    path(
        "login",
        auth_views.LoginView.as_view(
            template_name="frontend/login.html",
            redirect_authenticated_user=True,
            next_page="ui:monitor",
        ),
        name="login",
    ),
    path("logout", auth_views.LogoutView.as_view(next_page="ui:login"), name="logout"),
    # Runs
    path("runs/<str:run_id>", runs.run_detail, name="run"),
    re_path(
        rf"^runs/(?P<run_id>[^/]+)/(?P<action>{_ACTIONS})$", runs.run_action, name="run-action"
    ),
    path("runs/<str:run_id>/retry", runs.run_retry_view, name="run-retry"),
    # Approvals (notifications link to "approvals/<id>")
    path("approvals", approvals.approval_list, name="approvals"),
    path("approvals/<str:approval_id>", approvals.approval_detail, name="approval"),
    path(
        "approvals/<str:approval_id>/decide", approvals.approval_decide_view, name="approval-decide"
    ),
    # Patterns
    path("patterns", patterns.pattern_list, name="patterns"),
    path("patterns/new", patterns.pattern_create_view, name="pattern-create"),
    path("patterns/<slug:key>", patterns.pattern_detail, name="pattern"),
    path("patterns/<slug:key>/edit", patterns.pattern_edit_view, name="pattern-edit"),
    path("patterns/<slug:key>/trigger", patterns.pattern_trigger_view, name="pattern-trigger"),
    # Policy profiles
    path("policies", policies.policy_list, name="policies"),
    path("policies/compile", policies.policy_compile, name="policy-compile"),
    path("policies/<slug:tag>", policies.policy_detail, name="policy"),
    path(
        "policies/<slug:tag>/versions/<int:version>",
        policies.policy_version,
        name="policy-version",
    ),
    path("policies/<slug:tag>/diff", policies.policy_diff, name="policy-diff"),
    path("policies/<slug:tag>/draft", policies.policy_draft, name="policy-draft"),
    path("policies/<slug:tag>/publish", policies.policy_publish, name="policy-publish"),
    # Instructions (frontend/views/instructions.py)
    path("instructions", instruction_pages.instruction_list_view, name="instructions"),
    path("instructions/<slug:name>", instruction_pages.instruction_detail, name="instruction"),
    path(
        "instructions/<slug:name>/draft",
        instruction_pages.instruction_draft,
        name="instruction-draft",
    ),
    path(
        "instructions/<slug:name>/publish",
        instruction_pages.instruction_publish_view,
        name="instruction-publish",
    ),
    # Employees and model endpoints
    path("employees", agents.employee_list, name="employees"),
    path("employees/<slug:username>", agents.employee_detail, name="employee"),
    path(
        "employees/<slug:username>/harness",
        agents.employee_harness_view,
        name="employee-harness",
    ),
    path("employees/<slug:username>/grants", agents.employee_grant_add, name="employee-grant-add"),
    path(
        "employees/<slug:username>/grants/<str:grantee>/remove",
        agents.employee_grant_remove,
        name="employee-grant-remove",
    ),
    path("endpoints/<slug:name>", agents.endpoint_detail, name="endpoint"),
    path("gateway", gateway_pages.gateway_settings, name="gateway"),
    path(
        "gateway/aliases/<slug:name>/delete",
        gateway_pages.gateway_alias_delete,
        name="gateway-alias-delete",
    ),
    # API tokens (admins only; frontend/views/api_tokens.py)
    path("api-tokens", api_tokens.api_token_list, name="api-tokens"),
    path(
        "api-tokens/<str:prefix>/revoke",
        api_tokens.api_token_revoke_view,
        name="api-token-revoke",
    ),
    # Skills
    path("a2a-agents", a2a_agents.a2a_agent_list, name="a2a-agents"),
    path("a2a-agents/<slug:name>", a2a_agents.a2a_agent_detail, name="a2a-agent"),
    path(
        "a2a-agents/<slug:name>/refresh",
        a2a_agents.a2a_agent_refresh_view,
        name="a2a-agent-refresh",
    ),
    path("connectors", connectors.connector_list, name="connectors"),
    path("connectors/<slug:name>", connectors.connector_detail, name="connector"),
    path("connectors/<slug:name>/refresh", connectors.connector_refresh, name="connector-refresh"),
    path("skills", skills.skill_list, name="skills"),
    path("skills/new", skills.skill_create_view, name="skill-create"),
    path("skills/import", skill_import.skill_import_view, name="skill-import"),
    path("skills/snapshot", skill_snapshot.skill_snapshot_view, name="skill-snapshot"),
    path(
        "skills/snapshot/download",
        skill_snapshot.skill_snapshot_download,
        name="skill-snapshot-download",
    ),
    path("skills/<slug:tool_name>", skills.skill_detail, name="skill"),
    path("skills/<slug:tool_name>/edit", skills.skill_edit_view, name="skill-edit"),
    path("skills/<slug:tool_name>/test", skills.skill_test_view, name="skill-test"),
    path("skills/<slug:tool_name>/review", skills.skill_review_view, name="skill-review"),
    path(
        "skills/<slug:tool_name>/rollback",
        skill_version_pages.skill_rollback_view,
        name="skill-rollback",
    ),
    path(
        "skills/<slug:tool_name>/env/build",
        skill_env_pages.skill_env_build_view,
        name="skill-env-build",
    ),
    path(
        "skills/<slug:tool_name>/env/clear",
        skill_env_pages.skill_env_clear_view,
        name="skill-env-clear",
    ),
    path(
        "skills/<slug:tool_name>/executions/<str:execution_id>",
        skills.execution_detail,
        name="skill-execution",
    ),
    path(
        "skills/<slug:tool_name>/executions/<str:execution_id>/download",
        skills.execution_download,
        name="skill-execution-download",
    ),
    # Memory Inspector (agent memory)
    path("memory", memory.memory_list, name="memory"),
    path("memory/<str:item_id>", memory.memory_detail, name="memory-item"),
    path("memory/<str:item_id>/edit", memory.memory_edit, name="memory-edit"),
    path("memory/<str:item_id>/delete", memory.memory_delete_view, name="memory-delete"),
    # Knowledge bases (frontend/views/knowledge.py)
    path("knowledge", knowledge_pages.knowledge_list, name="knowledge"),
    path("knowledge/access", knowledge_pages.knowledge_access, name="knowledge-access"),
    path("knowledge/retrievals", knowledge_pages.knowledge_retrievals, name="knowledge-retrievals"),
    path("knowledge/<slug:key>", knowledge_pages.knowledge_detail, name="knowledge-base"),
    path(
        "knowledge/<slug:key>/documents",
        knowledge_pages.knowledge_upload,
        name="knowledge-upload",
    ),
    path(
        "knowledge/<slug:key>/search",
        knowledge_pages.knowledge_test_search,
        name="knowledge-search",
    ),
    # "/metrics" is the Prometheus exposition (orchestrator/metrics_view.py).
    path("ui/metrics", metrics.metrics, name="metrics"),
    path("ui/schemas/<slug:name>.json", schemas.json_schema, name="json-schema"),
    # Live updates (server-sent events)
    path("ui/stream/runs", streams.runs_stream, name="stream-runs"),
    path("ui/stream/approvals", streams.approvals_stream, name="stream-approvals"),
    path("ui/stream/runs/<str:run_id>", streams.run_stream, name="stream-run"),
]

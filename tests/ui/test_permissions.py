"""Every state-changing UI view refuses viewers, outsiders and anonymous visitors on the server,
whatever the page showed. Test-client requests (no browser), one per view and persona."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from frontend.access import GUARDED
from harness.models import HarnessProfileVersion
from harness.services import profile_save_draft
from loops.models import LoopPattern, LoopRun, RunStatus
from orchestrator.accounts.roles import Role
from tests.support.factories import make_pattern, make_run

pytestmark = pytest.mark.django_db

ClientAs = Callable[[str], Client]


def ui_routes() -> dict[str, Any]:
    """url name → view, for the UI's namespace."""
    resolver = get_resolver()
    found: dict[str, Any] = {}
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver) and entry.namespace == "ui":
            for pattern in entry.url_patterns:
                assert isinstance(pattern, URLPattern)
                found[pattern.name or ""] = pattern.callback
    return found


@pytest.fixture
def world() -> dict[str, Any]:
    pattern = make_pattern(key="greet")
    return {"pattern": pattern, "run": make_run(pattern, status=RunStatus.RUNNING)}


def _post_targets(world: dict[str, Any]) -> dict[str, tuple[str, dict[str, str], Role]]:
    """Every POST route of the UI: (url, a valid body, the role it needs)."""
    run = world["run"].id
    pattern_body = {
        "key": "new-one",
        "goal_template": "Do it",
        "autonomy_level": "L1",
        "trigger_type": "manual",
        "timezone": "UTC",
        "missed_fire_policy": "coalesce",
        "leader_username": "a",
        "verifier_username": "b",
        "leader_harness_tag": "default",
        "maker_harness_tag": "default",
        "verifier_harness_tag": "safe",
    }
    targets = {
        f"run-action:{action}": (f"/runs/{run}/{action}", {"reason": "x"}, Role.OPERATOR)
        for action in ("pause", "resume", "cancel", "escalate", "accept")
    }
    targets.update(
        {
            "run-retry": (f"/runs/{run}/retry", {}, Role.OPERATOR),
            "pattern-create": ("/patterns/new", pattern_body, Role.OPERATOR),
            "pattern-edit": ("/patterns/greet/edit", pattern_body, Role.OPERATOR),
            "pattern-trigger": ("/patterns/greet/trigger", {"inputs": "{}"}, Role.OPERATOR),
            "policy-draft": ("/policies/default/draft", {"settings": "{}"}, Role.ADMIN),
            "policy-publish": ("/policies/default/publish", {}, Role.ADMIN),
            # Instructions: admins write (as the API); the guard refuses before the lookup.
            "instructions": ("/instructions", {"name": "x"}, Role.ADMIN),
            "instruction-draft": ("/instructions/x/draft", {"text": "x"}, Role.ADMIN),
            "instruction-publish": ("/instructions/x/publish", {}, Role.ADMIN),
            # The guard refuses before the approval is looked up (an unknown id is fine here);
            # tests/ui/test_approvals_pages.py decides real ones.
            "approval-decide": (
                f"/approvals/{run}/decide",
                {"decision": "approve"},
                Role.APPROVER,
            ),
            # Skills: as skillhub/api.py (writes and test runs need the operator role); the
            # guard refuses before the skill is looked up. tests/ui/test_skills_pages.py.
            "skill-create": ("/skills/new", {"tool_name": "x"}, Role.OPERATOR),
            "skill-edit": ("/skills/greet/edit", {"title": "x"}, Role.OPERATOR),
            "skill-test": ("/skills/greet/test", {"inputs": "{}"}, Role.OPERATOR),
            # The guard refuses before the repository is read (tests/ui/test_skill_import_*.py).
            "skill-import": ("/skills/import", {"repository": "x"}, Role.OPERATOR),
            "skill-snapshot": ("/skills/snapshot", {"step": "preview"}, Role.OPERATOR),
            "skill-rollback": ("/skills/greet/rollback", {"reason": "x"}, Role.OPERATOR),
            "skill-review": ("/skills/greet/review", {"requires_review": "on"}, Role.OPERATOR),
            "skill-env-build": ("/skills/greet/env/build", {}, Role.OPERATOR),
            "skill-env-clear": ("/skills/greet/env/clear", {}, Role.OPERATOR),
            # The guard refuses before the employee is looked up.
            "employee-harness": ("/employees/x/harness", {"harness_tag": ""}, Role.OPERATOR),
            # Grants are access control: admins only (tests/ui/test_employee_endpoint_pages.py).
            "employee-grant-add": ("/employees/x/grants", {"username": "viewer"}, Role.ADMIN),
            "employee-grant-remove": ("/employees/x/grants/viewer/remove", {}, Role.ADMIN),
            # MCP servers reach outside with secrets: admins only (test_connector_pages.py).
            "connectors": ("/connectors", {"name": "x"}, Role.ADMIN),
            "connector-refresh": ("/connectors/x/refresh", {}, Role.ADMIN),
            "a2a-agents": ("/a2a-agents", {"name": "x"}, Role.ADMIN),
            "a2a-agent-refresh": ("/a2a-agents/x/refresh", {}, Role.ADMIN),
            # The guard refuses before the item is looked up (tests/memory/test_inspector.py).
            "memory-edit": (f"/memory/{run}/edit", {"content": "x"}, Role.OPERATOR),
            "memory-delete": (f"/memory/{run}/delete", {}, Role.OPERATOR),
            # The guard refuses before the base is looked up (tests/knowledge/test_knowledge_ui.py).
            "knowledge-access": ("/knowledge/access", {}, Role.OPERATOR),
            "knowledge-upload": ("/knowledge/x/documents", {}, Role.OPERATOR),
            "knowledge-search": ("/knowledge/x/search", {"query": "x"}, Role.OPERATOR),
            # Model aliases: operators write, as /api/v1/model-aliases (test_gateway_pages.py).
            "gateway": ("/gateway", {"name": "x", "rules": "[]"}, Role.OPERATOR),
            "gateway-alias-delete": ("/gateway/aliases/x/delete", {}, Role.OPERATOR),
            # API tokens: admins only, as /api/v1/api-tokens (tests/ui/test_api_tokens_browser.py).
            "api-tokens": ("/api-tokens", {"username": "x", "roles": "viewer"}, Role.ADMIN),
            "api-token-revoke": ("/api-tokens/abc/revoke", {}, Role.ADMIN),
        }
    )
    return targets


def test_every_state_changing_ui_view_is_guarded_and_covered_here(world: dict[str, Any]) -> None:
    routes = ui_routes()
    unguarded = {
        name for name, view in routes.items() if view not in GUARDED and name not in {"login"}
    }
    # login and logout are Django's own views; logout only ends the caller's own session.
    assert unguarded == {"logout"}
    posting = {name for name, view in routes.items() if "POST" in GUARDED.get(view, _NONE).methods}
    covered = {name.split(":")[0] for name in _post_targets(world)}
    assert posting == covered


class _NoGuard:
    methods: frozenset[str] = frozenset()


_NONE = _NoGuard()


def _state(world: dict[str, Any]) -> tuple[Any, ...]:
    run = LoopRun.objects.get(pk=world["run"].id)
    return (
        run.status,
        LoopRun.objects.count(),
        LoopPattern.objects.count(),
        LoopPattern.objects.get(key="greet").version,
        HarnessProfileVersion.objects.count(),
    )


@pytest.mark.parametrize("persona", ["viewer", "outsider", "approver"])
def test_roles_without_the_right_get_a_403_page_and_nothing_changes(
    persona: str, client_as: ClientAs, world: dict[str, Any]
) -> None:
    client = client_as(persona)
    profile_save_draft(tag="default", settings={}, note="pending")  # something to publish
    before = _state(world)
    for name, (url, body, role) in _post_targets(world).items():
        if persona == role.value:
            continue  # the approver may decide (tests/ui/test_approvals_pages.py)
        response = client.post(url, body)
        assert response.status_code == 403, name
        assert response["Content-Type"].startswith("text/html"), name
        assert f"needs the {role.value} role".encode() in response.content or (
            persona == "outsider" and b"no Loopwright role" in response.content
        ), name
    assert _state(world) == before


def test_an_operator_may_not_change_policies(client_as: ClientAs, world: dict[str, Any]) -> None:
    client = client_as("operator")
    for name, (url, body, role) in _post_targets(world).items():
        if role is Role.ADMIN:
            response = client.post(url, body)
            assert response.status_code == 403, name
            assert b"needs the admin role" in response.content


def test_anonymous_posts_are_sent_to_the_login_page(client: Client, world: dict[str, Any]) -> None:
    before = _state(world)
    for name, (url, body, _role) in _post_targets(world).items():
        response = client.post(url, body)
        assert response.status_code == 302, name
        assert response["Location"].startswith("/login?next="), name
    assert _state(world) == before


def test_an_operator_may_act_on_runs_and_patterns(
    client_as: ClientAs, world: dict[str, Any]
) -> None:
    client = client_as("operator")
    response = client.post(f"/runs/{world['run'].id}/pause", {"reason": ""})
    assert response.status_code == 302
    assert LoopRun.objects.get(pk=world["run"].id).status == RunStatus.PAUSED
    body = _post_targets(world)["pattern-trigger"][1]
    response = client.post("/patterns/greet/trigger", body)
    assert response.status_code == 302
    assert response["Location"].startswith("/runs/")


def test_an_admin_may_save_and_publish_a_policy_draft(
    client_as: ClientAs, world: dict[str, Any]
) -> None:
    client = client_as("admin")
    response = client.post("/policies/default/draft", {"settings": '{"paths": {"maxFiles": 10}}'})
    assert response.status_code == 302
    response = client.post("/policies/default/publish", {"version": "2"})
    assert response.status_code == 302
    assert (
        HarnessProfileVersion.objects.filter(profile__tag="default", version=2).get().is_published
    )


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/patterns",
        "/patterns/greet",
        "/policies",
        "/policies/default",
        "/instructions",
        "/employees",
    ],
)
def test_every_role_reads_pages_and_an_outsider_reads_none(
    path: str, client_as: ClientAs, world: dict[str, Any]
) -> None:
    assert client_as("viewer").get(path).status_code == 200
    refused = client_as("outsider").get(path)
    assert refused.status_code == 403
    assert b"no Loopwright role" in refused.content
    anonymous = client_as("anonymous").get(path)
    assert anonymous.status_code == 302
    assert anonymous["Location"].startswith("/login?next=")


@pytest.mark.parametrize(
    "path", ["/patterns/new", "/patterns/greet/edit", "/patterns/greet/trigger"]
)
def test_forms_that_only_serve_a_write_are_refused_to_viewers(
    path: str, client_as: ClientAs, world: dict[str, Any]
) -> None:
    assert client_as("viewer").get(path).status_code == 403
    assert client_as("operator").get(path).status_code == 200


def test_a_viewer_is_shown_no_buttons(client_as: ClientAs, world: dict[str, Any]) -> None:
    client = client_as("viewer")
    run_page = client.get(f"/runs/{world['run'].id}").content.decode()
    assert "<form" in run_page  # only the logout form
    assert run_page.count("<form") == 1
    assert "New pattern" not in client.get("/patterns").content.decode()
    detail = client.get("/patterns/greet").content.decode()
    assert "Trigger now" not in detail and ">Edit<" not in detail
    policy = client.get("/policies/default").content.decode()
    assert "New draft" not in policy


def test_an_operator_is_shown_the_actions_the_run_allows(
    client_as: ClientAs, world: dict[str, Any]
) -> None:
    page = client_as("operator").get(f"/runs/{world['run'].id}").content.decode()
    for label in ("Pause", "Escalate to a human", "Cancel run"):
        assert f">{label}</button>" in page
    for absent in ("Resume", "Accept result", "Retry as a new run"):
        assert f">{absent}</button>" not in page


def test_a_get_to_an_action_url_is_refused_without_effect(
    client_as: ClientAs, world: dict[str, Any]
) -> None:
    response = client_as("operator").get(f"/runs/{world['run'].id}/cancel")
    assert response.status_code == 405
    assert LoopRun.objects.get(pk=world["run"].id).status == RunStatus.RUNNING


def test_the_stream_endpoints_need_a_role(client_as: ClientAs, world: dict[str, Any]) -> None:
    for path in ("/ui/stream/runs", f"/ui/stream/runs/{world['run'].id}"):
        assert client_as("outsider").get(path).status_code == 403
        assert client_as("anonymous").get(path).status_code == 302

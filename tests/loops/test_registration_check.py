"""The registration check (seed 004) at save time: a pattern whose write or high-risk tools run
without a human gate where its autonomy level forbids it is refused (API and UI), and so is a
profile publish that would make a pattern following the profile break the rule. The same rule
binds where the call happens (``role_tool_policy``): see the last two tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from harness.models import HarnessProfile
from harness.services import (
    harness_snapshot,
    profile_create,
    profile_delete,
    profile_publish,
    profile_save_draft,
)
from loops.models import ActionApproval, LoopPattern
from loops.services.patterns import pattern_create, pattern_update
from loops.worker.invoker import role_tool_policy
from orchestrator.accounts.roles import Role
from orchestrator.accounts.services import user_ensure
from orchestrator.agents.models import Employee, ModelEndpoint
from orchestrator.agents.services import employee_create, model_endpoint_create
from orchestrator.errors import Conflict, InvalidInput
from runtime.invocation import InvocationRequest, LoopRole
from runtime.tools.specs import tool_spec
from tests.support.approvals import Engine, approval_pattern, park_inline, write_call

pytestmark = pytest.mark.django_db

TRUSTING = {"tools": {"allow": ["*"], "trustedPreHandlerTools": ["write", "edit"]}}
GATED = {"tools": {"allow": ["*"], "trustedPreHandlerTools": []}}
REPOSITORY = {
    "repository_key": "repo",
    "repository_root": "/srv/repo",
    "base_ref": "main",
    "acting_on": ["docs/"],
}
WORKTREE = {"harness": {"isolation": {"requireWorktree": True}}}
BODY = {
    "key": "fix-docs",
    "goal_template": "Fix the docs",
    "leader_username": "reg-lead",
    "maker_usernames": ["reg-maker"],
    "verifier_username": "reg-check",
}


@pytest.fixture
def endpoint() -> ModelEndpoint:
    return model_endpoint_create(
        name="reg-scripted", provider="scripted", script="demo", model="scripted"
    )


@pytest.fixture
def team(endpoint: ModelEndpoint) -> None:
    """A leader that binds write (it only ever gets read tools), a maker that binds the file
    writers, bash (high-risk) and a name no registry knows, a read-only verifier."""
    employee_create(username="reg-lead", endpoint=endpoint, tools=["read", "write"])
    employee_create(
        username="reg-maker", endpoint=endpoint, tools=["read", "write", "edit", "bash", "nope"]
    )
    employee_create(username="reg-check", endpoint=endpoint, tools=["read"])


@pytest.fixture
def trusting(db: None) -> HarnessProfile:
    return profile_create(tag="trusting", settings=TRUSTING)


def refused(**fields: Any) -> list[dict[str, str]]:
    with pytest.raises(InvalidInput) as caught:
        pattern_create(actor="test", **{**BODY, **fields})
    errors: list[dict[str, str]] = caught.value.extra["errors"]
    return errors


def of_code(errors: list[dict[str, str]], code: str) -> list[dict[str, str]]:
    return [e for e in errors if e["code"] == code]


# --- saving a pattern -------------------------------------------------------------------------


def test_l1_refuses_a_write_tool_the_makers_profile_trusts(team: None, trusting: Any) -> None:
    errors = refused(maker_harness_tag="trusting", leader_harness_tag="trusting")
    gates = of_code(errors, "autonomy_needs_gate")
    assert [(e["pointer"], e["tool"], e["role"], e["employee"], e["tier"]) for e in gates] == [
        ("/maker_harness_tag", "write", "maker", "reg-maker", "write"),
        ("/maker_harness_tag", "edit", "maker", "reg-maker", "write"),
    ]  # the leader binds write too, but the leader only ever gets read tools
    detail = gates[0]["detail"]
    assert "'write' (write tier) of maker 'reg-maker'" in detail
    assert "trustedPreHandlerTools trusts it (set by profile:trusting@1)" in detail
    assert "autonomy L1 needs a human gate for write tools" in detail
    assert "autonomy L2" in detail  # the way out it names
    assert not LoopPattern.objects.filter(key="fix-docs").exists()


def test_l1_refuses_an_allowlisted_write_with_the_pointer_to_the_entry(team: None) -> None:
    policy = {"approvals": {"autoAllowlist": ["read", "write", "nope", "unbound"]}}
    errors = refused(policy=policy)
    assert [(e["pointer"], e["tool"]) for e in errors] == [
        ("/policy/approvals/autoAllowlist/1", "write")
    ]  # read is read-tier; nope and unbound name nothing the maker can run
    assert "approvals.autoAllowlist waives its approval" in errors[0]["detail"]


def test_high_risk_needs_a_gate_at_l2_but_a_write_does_not(team: None) -> None:
    policy = {"approvals": {"autoAllowlist": ["write", "bash"]}, **WORKTREE}
    errors = refused(autonomy_level="L2", policy=policy, **REPOSITORY)
    assert [(e["pointer"], e["tool"], e["tier"]) for e in errors] == [
        ("/policy/approvals/autoAllowlist/1", "bash", "high-risk")
    ]
    assert "autonomy L2 needs a human gate for high-risk tools" in errors[0]["detail"]
    assert "autonomy L3" in errors[0]["detail"]
    policy["approvals"]["autoAllowlist"] = ["write"]
    pattern = pattern_create(actor="test", **BODY, autonomy_level="L2", policy=policy, **REPOSITORY)
    assert pattern.autonomy_level == "L2"


def test_l3_runs_whatever_the_harness_trusts(team: None, trusting: Any) -> None:
    policy = {"approvals": {"autoAllowlist": ["bash"]}, **WORKTREE}
    pattern = pattern_create(
        actor="test", **BODY, autonomy_level="L3", maker_harness_tag="trusting", policy=policy,
        **REPOSITORY,
    )  # fmt: skip
    assert pattern.version == 1


def test_a_gate_in_the_patterns_own_layer_satisfies_the_check(team: None, trusting: Any) -> None:
    policy = {"harness": {"tools": {"ask": ["write", "edit"]}}}
    pattern = pattern_create(actor="test", **BODY, maker_harness_tag="trusting", policy=policy)
    assert pattern.maker_harness_tag == "trusting"


def test_the_employees_own_layer_counts(endpoint: ModelEndpoint, trusting: Any) -> None:
    employee_create(username="reg-lead", endpoint=endpoint, tools=["read"])
    employee_create(username="reg-check", endpoint=endpoint, tools=["read"])
    employee_create(
        username="reg-maker",
        endpoint=endpoint,
        tools=["write"],
        harness={"tools": {"deny": ["write"]}},
    )
    assert pattern_create(actor="test", **BODY, maker_harness_tag="trusting").version == 1


def test_an_update_is_checked_and_a_refused_one_changes_nothing(team: None) -> None:
    pattern = pattern_create(actor="test", **BODY)
    with pytest.raises(InvalidInput) as caught:
        pattern_update(pattern=pattern, policy={"approvals": {"autoAllowlist": ["edit"]}})
    assert caught.value.extra["errors"][0]["pointer"] == "/policy/approvals/autoAllowlist/0"
    stored = LoopPattern.objects.get(pk=pattern.pk)
    assert (stored.version, stored.policy) == (1, {})


def test_a_worktree_profile_without_a_repository_is_refused(team: None) -> None:
    errors = refused(maker_harness_tag="file-heavy")
    worktree = of_code(errors, "worktree_needs_repository")
    assert [e["pointer"] for e in worktree] == ["/repository_key", "/repository_root", "/base_ref"]
    assert "maker 'reg-maker' requires a worktree" in worktree[0]["detail"]
    assert "set by profile:file-heavy@" in worktree[0]["detail"]
    # file-heavy also trusts write and edit: refused at L1 as well, at the tag's field.
    assert {e["tool"] for e in of_code(errors, "autonomy_needs_gate")} == {"write", "edit"}


def test_layers_the_compiler_refuses_point_at_the_patterns_fields(
    endpoint: ModelEndpoint,
) -> None:
    profile_create(tag="gone", settings=GATED)
    employee_create(username="reg-lead", endpoint=endpoint, tools=["read"])
    employee_create(username="reg-check", endpoint=endpoint, tools=["read"])
    employee_create(username="reg-maker", endpoint=endpoint, tools=["write"], harness_tag="gone")
    profile_delete(tag="gone")  # the maker's own profile no longer exists
    errors = refused(policy={"harness": {"limits": {"maxTokens": -1}}})
    assert [e["pointer"] for e in errors] == ["/policy/harness/limits/maxTokens"]
    (own,) = refused()
    assert own["pointer"] == "/maker_usernames" and "'gone'" in own["detail"]


def test_the_api_answers_problem_json_with_every_pointer(
    team: None, trusting: Any, api_client_for: Callable[[str], APIClient]
) -> None:
    body = {
        **BODY,
        "maker_harness_tag": "trusting",
        "policy": {"approvals": {"autoAllowlist": ["bash"]}},
    }
    response = api_client_for("operator").post("/api/v1/patterns", body, format="json")
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    pointers = [(e["pointer"], e["tool"]) for e in problem["errors"]]
    assert pointers == [
        ("/maker_harness_tag", "write"),
        ("/maker_harness_tag", "edit"),
        ("/policy/approvals/autoAllowlist/0", "bash"),
    ]
    assert "high-risk" in problem["errors"][2]["detail"]


# --- publishing a profile ---------------------------------------------------------------------


def test_a_publish_that_would_ungate_a_following_patterns_write_is_refused(
    team: None, api_client_for: Callable[[str], APIClient]
) -> None:
    profile_create(tag="team-p", settings=GATED)
    pattern_create(actor="test", **BODY, maker_harness_tag="team-p")
    pattern_create(actor="test", **{**BODY, "key": "pinned"}, maker_harness_tag="team-p@1")
    profile_save_draft(tag="team-p", settings=TRUSTING)
    response = api_client_for("admin").post(
        "/api/v1/harness-profiles/team-p/publish", {}, format="json"
    )
    assert response.status_code == 409, response.content
    problem = response.json()
    assert problem["patterns"] == ["fix-docs"]  # the pattern pinned to team-p@1 is unaffected
    assert [(e["pattern"], e["role"], e["employee"], e["tool"], e["pointer"], e["field"])
            for e in problem["errors"]] == [
        ("fix-docs", "maker", "reg-maker", "write", "/settings/tools/trustedPreHandlerTools",
         "/maker_harness_tag"),
        ("fix-docs", "maker", "reg-maker", "edit", "/settings/tools/trustedPreHandlerTools",
         "/maker_harness_tag"),
    ]  # fmt: skip
    assert "autonomy L1 needs a human gate for write tools" in problem["detail"]
    profile = HarnessProfile.objects.get(tag="team-p")
    assert profile.current_version.version == 1  # rolled back: the draft is still a draft
    assert profile.versions.get(version=2).status == "draft"


def test_a_publish_may_not_require_a_worktree_of_a_pattern_without_a_repository(team: None) -> None:
    profile_create(tag="team-w", settings=GATED)
    pattern_create(actor="test", **BODY, maker_harness_tag="team-w")
    profile_save_draft(tag="team-w", settings={**GATED, "isolation": {"requireWorktree": True}})
    with pytest.raises(Conflict) as caught:
        profile_publish(tag="team-w")
    errors = caught.value.extra["errors"]
    assert {(e["pointer"], e["field"]) for e in errors} == {
        ("/settings/isolation", "/repository_key"),
        ("/settings/isolation", "/repository_root"),
        ("/settings/isolation", "/base_ref"),
    }


def test_an_employee_following_the_tag_is_checked_too(endpoint: ModelEndpoint) -> None:
    profile_create(tag="emp", settings={"tools": {"allow": ["*"], "trustedPreHandlerTools": []}})
    profile_create(tag="team-t", settings=TRUSTING)
    employee_create(username="reg-lead", endpoint=endpoint, tools=["read"])
    employee_create(username="reg-check", endpoint=endpoint, tools=["read"])
    employee_create(username="reg-maker", endpoint=endpoint, tools=["write"], harness_tag="emp")
    # Trusted by team-t but not by the employee's own profile: gated, so the pattern saves.
    pattern_create(actor="test", **BODY, maker_harness_tag="team-t")
    profile_save_draft(tag="emp", settings=TRUSTING)
    with pytest.raises(Conflict) as caught:
        profile_publish(tag="emp")
    assert [(e["pattern"], e["tool"]) for e in caught.value.extra["errors"]] == [
        ("fix-docs", "write")
    ]


def test_a_problem_the_previous_version_had_does_not_block_a_publish(team: None) -> None:
    profile_create(tag="team-o", settings=TRUSTING)
    pattern = pattern_create(actor="test", **BODY, maker_harness_tag="team-o", autonomy_level="L3",
                             policy=WORKTREE, **REPOSITORY)  # fmt: skip
    # A pattern stored before the check (or changed past it): L1 with a trusted write.
    LoopPattern.objects.filter(pk=pattern.pk).update(autonomy_level="L1")
    profile_save_draft(tag="team-o", settings={**TRUSTING, "limits": {"maxTokens": 1000}})
    assert profile_publish(tag="team-o").version == 2


# --- the UI -----------------------------------------------------------------------------------


def ui_client(persona: str, roles: tuple[Role, ...]) -> Client:
    client = Client()
    client.force_login(user_ensure(username=persona, roles=roles))
    return client


def test_the_pattern_form_shows_the_refusals_at_their_fields(team: None, trusting: Any) -> None:
    form = {
        "key": "ui-docs", "goal_template": "Go", "autonomy_level": "L1", "trigger_type": "manual",
        "timezone": "UTC", "missed_fire_policy": "coalesce", "leader_username": "reg-lead",
        "maker_usernames": "reg-maker", "verifier_username": "reg-check",
        "leader_harness_tag": "default", "maker_harness_tag": "trusting",
        "verifier_harness_tag": "safe", "policy": '{"approvals": {"autoAllowlist": ["bash"]}}',
        "enabled": "on",
    }  # fmt: skip
    response = ui_client("op", (Role.OPERATOR,)).post("/patterns/new", form)
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert "'write' (write tier) of maker 'reg-maker'" in errors["maker_harness_tag"][0]
    assert errors["policy"][0].startswith("approvals.autoAllowlist.0: Tool 'bash' (high-risk")
    page = response.content.decode()
    assert "autonomy L1 needs a human gate for write tools" in page
    assert not LoopPattern.objects.filter(key="ui-docs").exists()


def test_the_publish_page_shows_a_refused_publish(team: None) -> None:
    profile_create(tag="team-u", settings=GATED)
    pattern_create(actor="test", **BODY, maker_harness_tag="team-u")
    profile_save_draft(tag="team-u", settings=TRUSTING)
    client = ui_client("adm", (Role.ADMIN,))
    response = client.post("/policies/team-u/publish", follow=True)
    page = response.content.decode()
    assert response.status_code == 200
    assert "Publishing version 2 of &#x27;team-u&#x27; is refused" in page
    assert page.count("Pattern fix-docs: Tool &#x27;") == 2  # write and edit, one line each
    assert "maker &#x27;reg-maker&#x27;" in page
    assert HarnessProfile.objects.get(tag="team-u").current_version.version == 1
    assert Employee.objects.filter(username="reg-maker").exists()


# --- the same rule where the call happens -----------------------------------------------------


def request_for(level: str, harness: dict[str, Any], allowlist: list[str]) -> InvocationRequest:
    return InvocationRequest(
        run_id=uuid.uuid4(), role=LoopRole.MAKER, invocation="maker:0",
        employee_username="reg-maker", goal="g", harness=harness,
        context={"autonomy_level": level, "auto_allowlist": allowlist},
    )  # fmt: skip


def test_the_role_policy_gates_what_the_level_forbids(trusting: Any) -> None:
    snapshot = harness_snapshot(tag="trusting")
    specs = [s for n in ("read", "write", "bash") if (s := tool_spec(n)) is not None]
    at_l1 = role_tool_policy(request_for("L1", snapshot, ["bash"]), specs)
    assert (at_l1.rule("write").decision, at_l1.rule("write").reason) == (
        "ask", "autonomy L1 needs a human gate for write tools"
    )  # fmt: skip
    assert at_l1.rule("bash").reason == "autonomy L1 needs a human gate for high-risk tools"
    assert at_l1.rule("read").decision == "allow"
    at_l2 = role_tool_policy(request_for("L2", snapshot, ["bash"]), specs)
    assert (at_l2.rule("write").decision, at_l2.rule("bash").decision) == ("allow", "ask")
    at_l3 = role_tool_policy(request_for("L3", snapshot, ["bash"]), specs)
    assert (at_l3.rule("write").decision, at_l3.rule("bash").decision) == ("allow", "allow")


def test_a_run_of_a_pattern_stored_before_the_check_still_parks_the_write(tmp_path: Path) -> None:
    """Through the engine: an L1 pattern whose allowlist predates the check (written past the
    service) cannot run the maker's write ungated; the approval names the rule."""
    pattern = approval_pattern("reg-stale")
    LoopPattern.objects.filter(pk=pattern.pk).update(
        policy={"approvals": {"autoAllowlist": ["write"]}}
    )
    pattern.refresh_from_db()
    engine = Engine(tmp_path / "ledger")
    run = park_inline(engine, pattern, [write_call("notes.txt", "hello")])
    approval = ActionApproval.objects.get(run=run)
    assert (approval.tool_name, approval.reason) == (
        "write", "autonomy L1 needs a human gate for write tools"
    )  # fmt: skip
    assert engine.writes_of(run.id) == []  # nothing was written before a human said so

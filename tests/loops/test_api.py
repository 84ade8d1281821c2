from __future__ import annotations

import json
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from rest_framework.renderers import JSONRenderer
from rest_framework.test import APIClient

from loops.models import LoopRun, RunStatus
from loops.serializers import TriggeredRunSerializer, triggered_run_data

pytestmark = pytest.mark.django_db
PROBLEM = "application/problem+json"

PATTERN = {
    "key": "fix-typos",
    "goal_template": "Fix typos in {{ inputs.path }}",
    "leader_username": "lead",
    "maker_usernames": ["maker-a", "maker-b"],
    "verifier_username": "checker",
}


@pytest.fixture
def operator(api_client_for: Callable[[str], APIClient]) -> APIClient:
    return api_client_for("operator")


def create_pattern(client: APIClient, **overrides: Any) -> dict[str, Any]:
    response = client.post("/api/v1/patterns", {**PATTERN, **overrides}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_anonymous_calls_get_401_problem_json(api_client_for: Callable[[str], APIClient]) -> None:
    response = api_client_for("anonymous").get("/api/v1/runs")
    assert response.status_code == 401
    assert response["Content-Type"] == PROBLEM
    assert response.json()["type"] == "/problems/not-authenticated"


def test_users_without_a_role_are_forbidden(api_client_for: Callable[[str], APIClient]) -> None:
    assert api_client_for("outsider").get("/api/v1/runs").status_code == 403


def test_operator_creates_a_pattern_and_triggers_a_run(operator: APIClient) -> None:
    pattern = create_pattern(operator)
    assert pattern["version"] == 1 and pattern["verifier_harness_tag"] == "safe"
    response = operator.post(
        "/api/v1/patterns/fix-typos/trigger", {"inputs": {"path": "docs/"}}, format="json"
    )
    assert response.status_code == 201, response.content
    run = response.json()
    assert run["status"] == "queued"
    assert run["goal"] == "Fix typos in docs/"
    assert run["role_bindings"] == {
        "leader": "lead",
        "makers": ["maker-a", "maker-b"],
        "verifier": "checker",
    }
    detail = operator.get(f"/api/v1/runs/{run['id']}").json()
    snapshots = detail["harness_snapshots"]
    assert snapshots["verifier"]["profile"]["tag"] == "safe"
    assert set(snapshots["makers"]) == {"maker-a", "maker-b"}
    events = operator.get(f"/api/v1/runs/{run['id']}/events").json()["results"]
    assert [e["type"] for e in events] == ["run.created"]


def test_pattern_rules_are_checked_and_every_problem_is_reported(operator: APIClient) -> None:
    response = operator.post(
        "/api/v1/patterns",
        {**PATTERN, "verifier_username": "lead", "leader_harness_tag": "no-such-profile",
         "policy": {"concurency": 2}},
        format="json",
    )  # fmt: skip
    assert response.status_code == 400
    assert response["Content-Type"] == PROBLEM
    pointers = {e["pointer"] for e in response.json()["errors"]}
    assert "/policy/concurency" in pointers


def test_verifier_must_differ_from_leader_and_makers(operator: APIClient) -> None:
    response = operator.post(
        "/api/v1/patterns", {**PATTERN, "verifier_username": "maker-a"}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["errors"][0]["pointer"] == "/verifier_username"


def test_unknown_harness_tags_are_refused(operator: APIClient) -> None:
    response = operator.post(
        "/api/v1/patterns", {**PATTERN, "maker_harness_tag": "nope"}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["errors"][0]["pointer"] == "/maker_harness_tag"


def test_l2_patterns_need_a_repository_identity_and_worktree_isolation(operator: APIClient) -> None:
    response = operator.post("/api/v1/patterns", {**PATTERN, "autonomy_level": "L2"}, format="json")
    assert response.status_code == 400
    pointers = {e["pointer"] for e in response.json()["errors"]}
    assert {"/repository_key", "/repository_root", "/base_ref", "/acting_on"} <= pointers
    assert "/policy/harness/isolation/requireWorktree" in pointers


def test_a_missing_template_input_is_a_400_naming_it(operator: APIClient) -> None:
    create_pattern(operator)
    response = operator.post("/api/v1/patterns/fix-typos/trigger", {}, format="json")
    assert response.status_code == 400
    assert "path" in response.json()["detail"]
    assert LoopRun.objects.count() == 0


def test_templates_cannot_reach_python_internals(operator: APIClient) -> None:
    create_pattern(operator, key="sneaky", goal_template="{{ inputs.__class__.__mro__ }}")
    response = operator.post("/api/v1/patterns/sneaky/trigger", {"inputs": {}}, format="json")
    assert response.status_code == 400


def test_bad_bodies_get_problem_json_not_500(operator: APIClient) -> None:
    create_pattern(operator)
    malformed = operator.post(
        "/api/v1/patterns/fix-typos/trigger", data="{not json", content_type="application/json"
    )
    assert malformed.status_code == 400 and malformed["Content-Type"] == PROBLEM
    wrong_type = operator.post("/api/v1/patterns/fix-typos/trigger", {"inputs": "x"}, format="json")
    assert wrong_type.status_code == 400
    assert wrong_type.json()["errors"][0]["pointer"] == "/inputs"
    missing = operator.post("/api/v1/patterns/nope/trigger", {}, format="json")
    assert missing.status_code == 404 and missing["Content-Type"] == PROBLEM
    assert operator.get("/api/v1/runs/not-a-uuid").status_code == 400


def test_disabled_patterns_refuse_triggers_with_a_reason(operator: APIClient) -> None:
    create_pattern(operator, enabled=False)
    response = operator.post(
        "/api/v1/patterns/fix-typos/trigger", {"inputs": {"path": "x"}}, format="json"
    )
    assert response.status_code == 409
    assert "disabled" in response.json()["detail"]


def test_actions_not_allowed_in_the_current_state_are_409_with_the_state(
    operator: APIClient,
) -> None:
    create_pattern(operator)
    run = operator.post(
        "/api/v1/patterns/fix-typos/trigger", {"inputs": {"path": "x"}}, format="json"
    ).json()
    assert run["allowed_actions"] == ["pause", "cancel"]
    accept = operator.post(f"/api/v1/runs/{run['id']}/accept", {}, format="json")
    assert accept.status_code == 409
    assert accept.json()["current_status"] == "queued"
    cancel = operator.post(
        f"/api/v1/runs/{run['id']}/cancel", {"reason": "not today"}, format="json"
    )
    assert cancel.status_code == 200 and cancel.json()["status"] == "canceled"
    assert cancel.json()["failure_reason"] == "Canceled by operator: not today"
    again = operator.post(f"/api/v1/runs/{run['id']}/cancel", {}, format="json")
    assert again.status_code == 409 and again.json()["current_status"] == "canceled"
    retry = operator.post(f"/api/v1/runs/{run['id']}/retry", {}, format="json")
    assert retry.status_code == 201
    assert retry.json()["retry_of"] == run["id"] and retry.json()["status"] == "queued"


def test_pause_and_resume_a_queued_run(operator: APIClient) -> None:
    create_pattern(operator)
    run = operator.post(
        "/api/v1/patterns/fix-typos/trigger", {"inputs": {"path": "x"}}, format="json"
    ).json()
    assert (
        operator.post(f"/api/v1/runs/{run['id']}/pause", {}, format="json").json()["status"]
        == "paused"
    )
    assert (
        operator.post(f"/api/v1/runs/{run['id']}/resume", {}, format="json").json()["status"]
        == "queued"
    )
    events = operator.get(f"/api/v1/runs/{run['id']}/events?after_seq=1").json()["results"]
    assert [e["type"] for e in events] == ["run.paused", "run.resumed"]


def test_a_viewer_can_read_but_not_act(
    operator: APIClient, api_client_for: Callable[[str], APIClient]
) -> None:
    create_pattern(operator)
    run = operator.post(
        "/api/v1/patterns/fix-typos/trigger", {"inputs": {"path": "x"}}, format="json"
    ).json()
    viewer = api_client_for("viewer")
    assert viewer.get("/api/v1/runs").status_code == 200
    assert viewer.get(f"/api/v1/runs/{run['id']}").status_code == 200
    assert viewer.post("/api/v1/patterns/fix-typos/trigger", {}, format="json").status_code == 403
    for action in ("pause", "resume", "cancel", "retry", "escalate", "accept"):
        assert (
            viewer.post(f"/api/v1/runs/{run['id']}/{action}", {}, format="json").status_code == 403
        )
    assert viewer.post("/api/v1/patterns", PATTERN, format="json").status_code == 403


def test_runs_are_filtered_by_pattern_and_status(operator: APIClient) -> None:
    create_pattern(operator)
    create_pattern(operator, key="other")
    for key in ("fix-typos", "fix-typos", "other"):
        operator.post(f"/api/v1/patterns/{key}/trigger", {"inputs": {"path": "x"}}, format="json")
    LoopRun.objects.filter(pattern__key="other").update(status=RunStatus.FAILED)
    assert operator.get("/api/v1/runs?pattern=fix-typos").json()["count"] == 2
    assert operator.get("/api/v1/runs?status=failed").json()["count"] == 1
    assert operator.get("/api/v1/runs?status=bogus").status_code == 400


def test_updating_a_pattern_bumps_its_version_and_runs_pin_it(operator: APIClient) -> None:
    create_pattern(operator)
    first = operator.post(
        "/api/v1/patterns/fix-typos/trigger", {"inputs": {"path": "x"}}, format="json"
    ).json()
    updated = operator.patch("/api/v1/patterns/fix-typos", {"title": "Typos"}, format="json")
    assert updated.status_code == 200 and updated.json()["version"] == 2
    second = operator.post(
        "/api/v1/patterns/fix-typos/trigger", {"inputs": {"path": "x"}}, format="json"
    ).json()
    assert (first["pattern_version"], second["pattern_version"]) == (1, 2)


def test_create_api_token_prints_only_the_token() -> None:
    out = StringIO()
    call_command("create_api_token", "robot", "--role", "operator", stdout=out)
    token = out.getvalue().strip()
    assert token.startswith("lw_") and "\n" not in token
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert client.get("/api/v1/patterns").status_code == 200
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}x")
    assert client.get("/api/v1/patterns").status_code == 401


def test_openapi_schema_is_served() -> None:
    response = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    assert "/api/v1/runs/{id}/cancel" in response.json()["paths"]


def test_runs_keep_the_harness_snapshot_they_started_with(
    operator: APIClient, api_client_for: Callable[[str], APIClient]
) -> None:
    create_pattern(operator, key="pinned", maker_harness_tag="default")
    trigger = {"inputs": {"path": "x"}}
    before = operator.post("/api/v1/patterns/pinned/trigger", trigger, format="json").json()
    admin = api_client_for("admin")
    current = admin.get("/api/v1/harness-profiles/default").json()
    settings = admin.get("/api/v1/harness-profiles/default/versions").json()
    latest = settings["results"][0] if isinstance(settings, dict) else settings[0]
    new_settings = dict(latest["settings"])
    new_settings["limits"] = {**new_settings.get("limits", {}), "maxToolCalls": 3}
    assert admin.post(
        "/api/v1/harness-profiles/default/save-draft", {"settings": new_settings}, format="json"
    ).status_code in (200, 201)
    assert (
        admin.post("/api/v1/harness-profiles/default/publish", {}, format="json").status_code == 200
    )
    after = operator.post("/api/v1/patterns/pinned/trigger", trigger, format="json").json()
    old_snap = operator.get(f"/api/v1/runs/{before['id']}").json()["harness_snapshots"]["makers"][
        "maker-a"
    ]
    new_snap = operator.get(f"/api/v1/runs/{after['id']}").json()["harness_snapshots"]["makers"][
        "maker-a"
    ]
    assert new_snap["profile"]["version"] == old_snap["profile"]["version"] + 1
    assert new_snap["settings"]["limits"]["maxToolCalls"] == 3
    assert old_snap["settings"]["limits"].get("maxToolCalls") != 3
    assert current["tag"] == "default"


def test_a_trigger_and_a_retry_answer_what_their_serializer_renders(operator: APIClient) -> None:
    def same_as_serializer(response: Any) -> None:
        assert response.status_code == 201, response.content
        run = LoopRun.objects.get(pk=response.json()["id"])
        rendered = JSONRenderer().render(TriggeredRunSerializer(run).data)
        assert list(response.json().items()) == list(json.loads(rendered).items())
        assert triggered_run_data(run) == TriggeredRunSerializer(run).data

    create_pattern(operator)
    body = {"inputs": {"path": "a"}, "harness_overrides": {"limits": {"maxInvocations": 10**6}}}
    first = operator.post("/api/v1/patterns/fix-typos/trigger", body, format="json")
    same_as_serializer(first)
    assert first.json()["harness_notices"] != []
    run_id = first.json()["id"]
    assert operator.post(f"/api/v1/runs/{run_id}/cancel", {}, format="json").status_code == 200
    retry = operator.post(f"/api/v1/runs/{run_id}/retry", {}, format="json")
    same_as_serializer(retry)
    assert retry.json()["retry_of"] == run_id

"""Content safety in runs (the pattern's ``policy.contentSafety``, docs/guardrails.md): an input
rule blocks the goal before any model request, an output rule stops the run on the model's
answer, a moderation endpoint flags or, unreachable, lets through or blocks by its ``failMode``;
every blocking or failed decision is a run event naming the rule and the stage, the run's
``terminal_reason`` is ``content_safety:<rule>``, and an invalid configuration is a 400 with
pointers under ``/policy/contentSafety``. The production invoker, a model over loopback HTTP, the
pattern and the run through the REST API."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from loops.models import LoopEvent, LoopRun, RunStatus
from loops.services.runs import run_trigger
from orchestrator.agents.services import (
    employee_create,
    model_endpoint_create,
    sub_agent_binding_create,
)
from tests.support.approvals import (
    LEADER,
    MAKER,
    PLAN,
    VERDICT,
    VERIFIER,
    approval_pattern,
    drive_production,
    http_reply,
    loopback_team,
    role_of,
    tool_results,
)
from tests.support.bash_chaos import git_repository, with_autonomy
from tests.support.model_server import Completion, ModelServer, RecordedRequest
from tests.support.moderation_server import ModerationServer, moderation_server

__all__ = ["moderation_server"]
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("seeded_profiles"),
    pytest.mark.timeout(120),
]
SECRET_WORD = "bluefalcon"


def dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def operator(api_client_for: Callable[[str], APIClient]) -> APIClient:
    return api_client_for("operator")


def pattern_body(key: str, content_safety: Any) -> dict[str, Any]:
    return {
        "key": key,
        "goal_template": "Content safety test {{ inputs.get('label', '') }}",
        "leader_username": LEADER,
        "maker_usernames": [MAKER],
        "verifier_username": VERIFIER,
        "policy": {"contentSafety": content_safety},
    }


def guarded_pattern(
    operator: APIClient, model: ModelServer, content_safety: Any, **fields: Any
) -> None:
    """The approvals team on ``model`` and pattern ``cs`` under ``content_safety``, through the
    API."""
    loopback_team(model.url, "cs")
    body = {**pattern_body("cs", content_safety), **fields}
    created = operator.post("/api/v1/patterns", body, format="json")
    assert created.status_code == 201, created.content


def run_once(
    operator: APIClient, **inputs: Any
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """Trigger pattern ``cs`` through the API and drive the run with the production invoker;
    the run, its events and its steps as the API shows them."""
    triggered = operator.post("/api/v1/patterns/cs/trigger", {"inputs": inputs}, format="json")
    assert triggered.status_code == 201, triggered.content
    run_id = triggered.json()["id"]
    drive_production(uuid.UUID(run_id))
    run = operator.get(f"/api/v1/runs/{run_id}").json()
    events = operator.get(f"/api/v1/runs/{run_id}/events").json()["results"]
    steps = operator.get(f"/api/v1/runs/{run_id}/steps").json()["results"]
    return run, events, steps


def run_guarded(
    operator: APIClient, model: ModelServer, content_safety: dict[str, Any], label: str = ""
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    guarded_pattern(operator, model, content_safety)
    run, events, _steps = run_once(operator, label=label)
    return run, events


def safety_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if str(e["type"]).startswith("content_safety.")]


def test_a_blocklisted_word_in_the_makers_answer_stops_the_run(operator: APIClient) -> None:
    def reply(request: RecordedRequest) -> Completion:
        if role_of(request.body["messages"]) == "maker":
            return Completion(content=f"Done. The password is {SECRET_WORD}.", model="cs")
        return http_reply(request)

    rules = {"output": [{"name": "no-falcon", "kind": "blocklist", "words": [SECRET_WORD]}]}
    with ModelServer() as model:
        model.always(reply)
        run, events = run_guarded(operator, model, rules)
        assert SECRET_WORD not in json.dumps(model.bodies)  # the rules are not in any prompt
    assert run["status"] == "failed"
    assert run["terminal_reason"] == "content_safety:no-falcon"
    assert "'no-falcon'" in run["failure_reason"] and "output" in run["failure_reason"]
    (blocked,) = safety_events(events)
    assert blocked["type"] == "content_safety.blocked"
    assert blocked["data"]["stage"] == "output" and blocked["data"]["blocked_by"] == "no-falcon"
    assert blocked["data"]["decisions"][0]["verdict"] == "block"
    # The blocked answer is not copied into the record (the reason names the configured word);
    # its usage is.
    steps = operator.get(f"/api/v1/runs/{run['id']}/steps").json()["results"]
    assert "password is" not in json.dumps([run, events, steps])
    assert blocked["data"]["decisions"][0]["reason"].startswith("contains blocked word")
    withheld = [s for s in steps if s["kind"] == "model" and s["error"]]
    assert len(withheld) == 1 and withheld[0]["response"]["finish_reason"] == "content_filter"
    # The run's policy snapshot holds the normalized configuration.
    assert run["policy_snapshot"]["contentSafety"]["output"][0]["failMode"] == "closed"
    assert not any(e["type"] == "verification.started" for e in events)


def test_input_rules_block_the_goal_before_any_model_request(
    operator: APIClient, moderation_server: ModerationServer
) -> None:
    rules = {
        "input": [
            {"name": "no-falcon", "kind": "blocklist", "words": [SECRET_WORD]},
            {"name": "moderated", "kind": "moderation", "url": moderation_server.url},
        ]
    }
    with ModelServer() as model:
        model.always(http_reply)
        guarded_pattern(operator, model, rules)
        listed, listed_events, _ = run_once(operator, label=SECRET_WORD)
        # The built-in rules run first and stop at a block: nothing was sent anywhere.
        assert model.requests == [] and moderation_server.requests == []
        flagged, flagged_events, _ = run_once(operator, label="attack plan")
        assert model.requests == []
    assert listed["terminal_reason"] == "content_safety:no-falcon"
    (blocked,) = safety_events(listed_events)
    assert blocked["data"]["stage"] == "input"
    assert blocked["data"]["invocation"].startswith("leader")
    assert flagged["terminal_reason"] == "content_safety:moderated"
    (blocked,) = safety_events(flagged_events)
    assert blocked["data"]["decisions"][-1]["kind"] == "moderation"
    assert "violence" in blocked["data"]["decisions"][-1]["reason"]


@pytest.mark.parametrize(("fail_mode", "passes"), [("open", True), ("closed", False)])
def test_an_unreachable_moderation_endpoint_follows_its_fail_mode(
    operator: APIClient, fail_mode: str, passes: bool
) -> None:
    rule = {
        "name": "moderated",
        "kind": "moderation",
        "url": f"http://127.0.0.1:{dead_port()}/v1/moderations",
        "failMode": fail_mode,
        "timeoutMs": 500,
    }
    with ModelServer() as model:
        model.always(http_reply)
        run, events = run_guarded(operator, model, {"input": [rule]})
    noted = safety_events(events)
    assert noted
    if passes:
        assert run["status"] == "succeeded", run
        assert {e["type"] for e in noted} == {"content_safety.error"}
        assert noted[0]["data"]["decisions"][0]["verdict"] == "error_open"
    else:
        assert run["status"] == "failed"
        assert run["terminal_reason"] == "content_safety:moderated"
        assert [e["type"] for e in noted] == ["content_safety.blocked"]
        assert noted[0]["data"]["decisions"][0]["verdict"] == "error_closed"


def test_a_secret_in_tool_call_arguments_is_blocked_before_the_call_and_masked(
    operator: APIClient,
) -> None:
    planted = "AKIAIOSFODNN7EXAMPLE"
    rules = {"output": [{"name": "no-keys", "kind": "secrets"}]}
    write = ["write", {"path": "notes.txt", "content": f"key {planted}\n"}]
    with ModelServer() as model:
        model.always(http_reply)
        guarded_pattern(operator, model, rules)
        run, events, steps = run_once(operator, rounds=[[write]])
    assert run["terminal_reason"] == "content_safety:no-keys"
    assert not [s for s in steps if s["kind"] == "tool"]  # the write was never proposed
    withheld = [s["response"] for s in steps if s["kind"] == "model" and s["error"]]
    assert planted not in json.dumps([run["failure_reason"], safety_events(events), withheld])
    assert "AKIA***" in run["failure_reason"]


def test_a_sub_agents_blocked_answer_stops_the_run(tmp_path: Path) -> None:
    def reply(request: RecordedRequest) -> Completion:
        messages = request.body["messages"]
        if "You are a sub-agent" in str(messages[0].get("content")):
            return Completion(content=f"The password is {SECRET_WORD}.")
        role = role_of(messages)
        if role in ("leader", "verifier"):
            return Completion(content=json.dumps(PLAN if role == "leader" else VERDICT))
        if not tool_results(messages):
            task = {"employee": "cs-helper", "task": "Find the password."}
            return Completion(tool_calls=[("dispatch_sub_agent_task", json.dumps(task))])
        return Completion(content="Done: " + " | ".join(tool_results(messages)))

    rules = {"output": [{"name": "no-falcon", "kind": "blocklist", "words": [SECRET_WORD]}]}
    with ModelServer() as model:
        model.always(reply)
        endpoint = model_endpoint_create(
            name="cs-sub", provider="openai", base_url=model.url, model="cs", max_retries=0
        )
        employee_create(username=LEADER, endpoint=endpoint, tools=["read"])
        boss = employee_create(username=MAKER, endpoint=endpoint, tools=["dispatch_sub_agent_task"])
        helper = employee_create(username="cs-helper", endpoint=endpoint, tools=["read"])
        employee_create(username=VERIFIER, endpoint=endpoint, tools=["read"])
        sub_agent_binding_create(parent=boss, child=helper)
        fields = with_autonomy(
            "L2", git_repository(tmp_path / "repo"), ["dispatch_sub_agent_task"],
            contentSafety=rules,
        )  # fmt: skip
        run = run_trigger(pattern=approval_pattern("cs-sub", **fields), actor="op", inputs={})
        assert drive_production(run.id) == RunStatus.FAILED
    final = LoopRun.objects.get(pk=run.id)
    assert final.terminal_reason == "content_safety:no-falcon"
    [blocked] = LoopEvent.objects.filter(run=run, type="content_safety.blocked")
    assert blocked.data["invocation"].endswith("> cs-helper")
    # The maker read the child's failure; its next call stopped the run.
    assert not LoopEvent.objects.filter(run=run, type="verification.started").exists()


def test_each_message_is_checked_once_per_invocation(
    operator: APIClient, moderation_server: ModerationServer, tmp_path: Path
) -> None:
    rules = {"input": [{"name": "moderated", "kind": "moderation", "url": moderation_server.url}]}
    with ModelServer() as model:
        model.always(http_reply)
        repository = str(git_repository(tmp_path / "repo"))
        guarded_pattern(operator, model, rules, repository_root=repository, base_ref="main")
        run, _events, _steps = run_once(operator, rounds=[[["read", {"path": "README"}]]])
        assert run["status"] == RunStatus.SUCCEEDED, run
        calls = len(model.requests)
    # Every model call sent something new (the goals, then the tool result alone); nothing of
    # the history was sent to the moderation endpoint twice within an invocation.
    checked = [str(request.body["input"]) for request in moderation_server.requests]
    assert calls == len(checked) == 4
    assert [text for text in checked if "Content safety test" not in text] == [checked[2]]
    assert "hello" in checked[2]

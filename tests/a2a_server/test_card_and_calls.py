"""A pattern served as an A2A agent, through the official ``a2a-sdk`` client over real HTTP
against the production ASGI app: its agent card (name, one skill from its goal and inputs, the
JSON-RPC URL, bearer tokens); 401 without a valid token, 403 for a role that may not start runs,
404 for a pattern that does not exist or is not served; a message's inputs from a data part,
from JSON text and from plain text; clear JSON-RPC errors for bad input, never a 500."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from a2a.client import A2AClientError, ClientConfig, ClientFactory
from a2a.client.errors import AgentCardResolutionError
from a2a.types.a2a_pb2 import GetTaskRequest, Message, Part, Role, SendMessageRequest, TaskState
from a2a.utils.errors import (
    InvalidParamsError,
    InvalidRequestError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from loops.models import LoopPattern, LoopRun, RunStatus
from loops.services.patterns import pattern_create, pattern_update
from orchestrator.accounts.roles import Role as LoopwrightRole
from tests.a2a_server.conftest import (
    authorised,
    card_of,
    client_for,
    data_message,
    run_async,
    text_message,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
GOAL = "Summarise {{ inputs.topic }} for {{ inputs['audience'] }}{{ inputs.get('note', '') }}."


def served(key: str = "brief", *, a2a_enabled: bool = True, **fields: Any) -> LoopPattern:
    values: dict[str, Any] = {
        "title": "Research brief",
        "description": "Writes a short research brief.",
        "goal_template": GOAL,
        "leader_username": "a2a-leader",
        "maker_usernames": ["a2a-maker"],
        "verifier_username": "a2a-verifier",
        "a2a_enabled": a2a_enabled,
    }
    values.update(fields)
    return pattern_create(key=key, actor="test", **values)


async def _send(base: str, key: str, token: str, request: SendMessageRequest) -> Any:
    """One message, returned at once (``returnImmediately``): the task as it starts."""
    async with authorised(token) as http:
        client = await client_for(base, key, http, streaming=False, polling=True)
        return [event async for event in client.send_message(request)]


def send(base: str, key: str, token: str, request: SendMessageRequest) -> Any:
    [event] = run_async(_send(base, key, token, request))
    assert event.HasField("task")
    return event.task


def test_the_agent_card_names_the_pattern_its_skill_inputs_url_and_auth(
    server: str, token_of: Callable[..., str]
) -> None:
    served()
    card = run_async(card_of(server, "brief", token_of("reader", LoopwrightRole.VIEWER)))
    assert card.name == "Research brief"
    assert card.description == "Writes a short research brief."
    assert card.version == "1"
    assert card.capabilities.streaming and not card.capabilities.push_notifications
    interfaces = {
        (i.protocol_binding, i.protocol_version, i.url) for i in card.supported_interfaces
    }
    url = f"{server}/a2a/brief"
    assert interfaces == {("JSONRPC", "1.0", url), ("JSONRPC", "0.3", url)}
    [skill] = card.skills
    assert (skill.id, skill.name) == ("brief", "Research brief")
    assert GOAL in skill.description
    assert "Inputs: audience, note, topic." in skill.description
    assert list(skill.examples) == ['{"audience": "...", "note": "...", "topic": "..."}']
    scheme = card.security_schemes["loopwrightToken"].http_auth_security_scheme
    assert scheme.scheme == "Bearer"
    assert [list(r.schemes) for r in card.security_requirements] == [["loopwrightToken"]]


def test_no_valid_token_is_a_401_for_the_card_and_for_json_rpc(
    server: str, token_of: Callable[..., str]
) -> None:
    served()
    for headers in ({}, {"Authorization": "Bearer lw_nope_nope"}, {"Authorization": "Basic x"}):
        card = httpx.get(f"{server}/a2a/brief/.well-known/agent-card.json", headers=headers)
        rpc = httpx.post(f"{server}/a2a/brief", headers=headers, json={"jsonrpc": "2.0"})
        for response in (card, rpc):
            assert response.status_code == 401
            assert response.headers["content-type"] == "application/problem+json"
            assert response.headers["www-authenticate"] == 'Bearer realm="loopwright"'
    with pytest.raises(AgentCardResolutionError) as caught:
        run_async(card_of(server, "brief", "lw_nope_nope"))
    assert caught.value.status_code == 401
    card = run_async(card_of(server, "brief", token_of("reader", LoopwrightRole.VIEWER)))

    async def send_with_a_bad_token() -> None:
        async with authorised("lw_nope_nope") as http:
            client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
            async for _event in client.send_message(text_message("hi")):
                pass

    with pytest.raises(A2AClientError, match="HTTP Error 401"):
        run_async(send_with_a_bad_token())
    assert not LoopRun.objects.exists()


def test_an_unknown_or_unserved_pattern_is_a_404(
    server: str, token_of: Callable[..., str], operator_token: str
) -> None:
    hidden = served("hidden", a2a_enabled=False)
    for key in ("hidden", "missing"):
        for response in (
            httpx.get(
                f"{server}/a2a/{key}/.well-known/agent-card.json",
                headers={"Authorization": f"Bearer {operator_token}"},
            ),
            httpx.post(
                f"{server}/a2a/{key}",
                headers={"Authorization": f"Bearer {operator_token}"},
                json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}},
            ),
        ):
            assert response.status_code == 404, response.text
            assert response.json()["type"] == "/problems/not-found"
    pattern_update(pattern=hidden, a2a_enabled=True)
    assert run_async(card_of(server, "hidden", operator_token)).name == "Research brief"
    unknown = httpx.get(f"{server}/a2a", headers={"Authorization": f"Bearer {operator_token}"})
    assert unknown.status_code == 404
    assert unknown.headers["content-type"] == "application/problem+json"


def test_starting_a_run_needs_the_operator_role_reading_any_role(
    server: str, token_of: Callable[..., str]
) -> None:
    served()
    viewer = token_of("watcher", LoopwrightRole.VIEWER)
    outsider = token_of("nobody")
    with pytest.raises(A2AClientError, match="HTTP Error 403"):
        run_async(_send(server, "brief", viewer, text_message("hi")))
    assert not LoopRun.objects.exists()
    refused = httpx.get(
        f"{server}/a2a/brief/.well-known/agent-card.json",
        headers={"Authorization": f"Bearer {outsider}"},
    )
    assert refused.status_code == 403
    assert run_async(card_of(server, "brief", viewer)).skills[0].id == "brief"


def test_a_data_part_is_the_runs_inputs(server: str, operator_token: str) -> None:
    served()
    inputs = {"topic": "tides", "audience": "pupils", "count": 3, "tags": ["a", 1.5]}
    task = send(server, "brief", operator_token, data_message(inputs))
    run = LoopRun.objects.get(pk=task.id)
    assert run.inputs == inputs
    assert (run.trigger_type, run.triggered_by, run.status) == ("a2a", "a2a-operator", "queued")
    assert run.goal == "Summarise tides for pupils."
    assert task.status.state == TaskState.TASK_STATE_WORKING
    assert run.trigger_ref == task.context_id and task.context_id


def test_json_object_text_is_the_inputs_other_text_is_a_message(
    server: str, operator_token: str
) -> None:
    served(goal_template="Answer: {{ inputs.message }}", key="ask")
    served(key="brief")
    as_json = send(
        server, "brief", operator_token, text_message('{"topic": "owls", "audience": "all"}')
    )
    assert LoopRun.objects.get(pk=as_json.id).inputs == {"topic": "owls", "audience": "all"}
    for text in ("What is a tide?", "[1, 2]", "{not json"):
        task = send(server, "ask", operator_token, text_message(text))
        run = LoopRun.objects.get(pk=task.id)
        assert run.inputs == {"message": text}
        assert run.goal == f"Answer: {text}"


def test_bad_messages_are_json_rpc_errors_and_start_nothing(
    server: str, operator_token: str
) -> None:
    served()
    file_only = SendMessageRequest(
        message=Message(message_id="m", role=Role.ROLE_USER, parts=[Part(url="https://x/y")])
    )
    cases = [
        (data_message({"audience": "pupils"}), InvalidParamsError, "topic"),  # input missing
        (text_message("   "), InvalidParamsError, "data part"),
        (file_only, InvalidParamsError, "data part"),
    ]
    for request, error, words in cases:
        with pytest.raises(error, match=words):
            run_async(_send(server, "brief", operator_token, request))
    follow_up = data_message({"topic": "t", "audience": "a"})
    follow_up.message.task_id = "0190f0f0-0000-7000-8000-000000000000"
    with pytest.raises(UnsupportedOperationError, match="new run"):
        run_async(_send(server, "brief", operator_token, follow_up))
    assert not LoopRun.objects.exists()
    headers = {"Authorization": f"Bearer {operator_token}", "A2A-Version": "1.0"}
    raw = [
        (b"{not json", -32700),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "Nope", "params": {}}', -32601),
        (b'{"jsonrpc": "2.0", "id": 2, "method": "SendMessage", "params": {"message": 7}}', -32602),
        (b'{"jsonrpc": "2.0", "id": 3, "method": "GetTask", "params": {"id": "\\u0000"}}', -32600),
        (b"[" * 200 + b"]" * 200, -32600),
    ]
    for body, code in raw:
        response = httpx.post(f"{server}/a2a/brief", content=body, headers=headers)
        assert response.status_code == 200, response.text
        assert response.json()["error"]["code"] == code, response.text


def test_a_refused_trigger_is_a_clear_error(server: str, operator_token: str) -> None:
    pattern = served()
    pattern_update(pattern=pattern, enabled=False)
    with pytest.raises(InvalidRequestError, match="disabled") as caught:
        run_async(_send(server, "brief", operator_token, data_message({"topic": "t"})))
    assert caught.value.data == {"status": "409", "problem": "conflict"}
    assert not LoopRun.objects.exists()


def test_tasks_of_another_pattern_or_unknown_ids_are_not_found(
    server: str, operator_token: str
) -> None:
    served()
    served(key="other")
    task = send(server, "brief", operator_token, data_message({"topic": "t", "audience": "a"}))

    async def get(key: str, task_id: str) -> Any:
        async with authorised(operator_token) as http:
            client = await client_for(server, key, http)
            return await client.get_task(GetTaskRequest(id=task_id))

    assert run_async(get("brief", task.id)).status.state == TaskState.TASK_STATE_WORKING
    for key, task_id in (("other", task.id), ("brief", "not-a-uuid"), ("brief", "")):
        with pytest.raises((TaskNotFoundError, InvalidParamsError)):
            run_async(get(key, task_id))
    assert LoopRun.objects.get(pk=task.id).status == RunStatus.QUEUED


def test_the_documented_json_rpc_requests_and_the_0_3_names_work(
    server: str, operator_token: str
) -> None:
    served(key="fix-typos", goal_template="Fix the typos under {{ inputs.path }}")
    url, auth = f"{server}/a2a/fix-typos", {"Authorization": f"Bearer {operator_token}"}
    v1 = {**auth, "A2A-Version": "1.0"}
    send = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {
            "message": {
                "messageId": "m-1",
                "role": "ROLE_USER",
                "parts": [{"data": {"path": "docs/"}}],
            },
            "configuration": {"returnImmediately": True},
        },
    }
    task = httpx.post(url, json=send, headers=v1).json()["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_WORKING"
    assert LoopRun.objects.get(pk=task["id"]).goal == "Fix the typos under docs/"
    get = {"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": task["id"]}}
    assert httpx.post(url, json=get, headers=v1).json()["result"]["id"] == task["id"]
    unversioned = httpx.post(url, json=get, headers=auth).json()
    assert unversioned["error"]["code"] == -32009  # 1.0 names need the version header

    old_send = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "message/send",
        "params": {
            "message": {
                "messageId": "m-2",
                "role": "user",
                "parts": [{"kind": "text", "text": '{"path": "src/"}'}],
            },
            "configuration": {"blocking": False},
        },
    }
    old_task = httpx.post(url, json=old_send, headers=auth).json()["result"]
    assert (old_task["kind"], old_task["status"]["state"]) == ("task", "working")
    assert LoopRun.objects.get(pk=old_task["id"]).inputs == {"path": "src/"}
    cancel = {"jsonrpc": "2.0", "id": 4, "method": "tasks/cancel", "params": {"id": old_task["id"]}}
    assert (
        httpx.post(url, json=cancel, headers=auth).json()["result"]["status"]["state"] == "canceled"
    )
    assert LoopRun.objects.get(pk=old_task["id"]).status == RunStatus.CANCELED

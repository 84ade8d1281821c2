"""The pure half of the A2A server: every run status has one task state (parked runs need
input), a message's parts become inputs by the documented rule, a task shows the verdict and
the cited evidence only once the run succeeded, and a goal template names its inputs."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from a2a.server.context import ServerCallContext
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError, InvalidRequestError
from google.protobuf import json_format, struct_pb2

from a2a_server.handler import CALLER_KEY, PATTERN_KEY, PatternRequestHandler
from a2a_server.protocol import message_inputs, run_task, task_state
from a2a_server.records import A2ACaller, EvidenceView, RunView
from loops.models import RunStatus
from loops.state import PARKED, TERMINAL
from loops.templates import template_inputs

S = TaskState


def test_every_run_status_maps_to_one_task_state() -> None:
    expected = {
        "succeeded": S.TASK_STATE_COMPLETED,
        "failed": S.TASK_STATE_FAILED,
        "canceled": S.TASK_STATE_CANCELED,
    }
    for status in RunStatus:
        if status in TERMINAL:
            want = expected[status.value]
        elif status in PARKED:
            want = S.TASK_STATE_INPUT_REQUIRED
        else:
            want = S.TASK_STATE_WORKING
        assert task_state(status.value) == want, status
    assert task_state("waiting_approval") == S.TASK_STATE_INPUT_REQUIRED
    with pytest.raises(ValueError, match="unknown"):
        task_state("exploded")


def _message(*parts: Part) -> Message:
    return Message(message_id="m", role=Role.ROLE_USER, parts=list(parts))


def _data(value: object) -> Part:
    return Part(data=json_format.ParseDict(value, struct_pb2.Value()))


def test_inputs_come_from_the_data_part_then_json_text_then_text() -> None:
    assert message_inputs(_message(_data({"n": 3, "x": 1.5, "l": [2]}), Part(text="ignored"))) == {
        "n": 3,
        "x": 1.5,
        "l": [2],
    }
    assert message_inputs(_message(Part(text=' {"a": [1, {"b": null}]} '))) == {
        "a": [1, {"b": None}]
    }
    assert message_inputs(_message(Part(text="one"), Part(text="two"))) == {"message": "one\ntwo"}
    assert message_inputs(_message(Part(text='"just a string"'))) == {"message": '"just a string"'}
    for bad in (
        _message(_data([1, 2])),
        _message(_data({"a": 1}), _data({"b": 2})),
        _message(),
        _message(Part(text=" \n")),
        _message(Part(text='{"a": "\\u0000"}')),
    ):
        with pytest.raises(InvalidParamsError):
            message_inputs(bad)


def _view(status: str, **fields: object) -> RunView:
    return RunView(
        id="r1",
        pattern="p",
        status=status,
        context_id="c1",
        updated_at=datetime(2026, 1, 1, tzinfo=UTC),
        **fields,  # type: ignore[arg-type]
    )


def test_artifacts_only_for_a_succeeded_run_with_a_verdict() -> None:
    verdict = {"verdict": "pass", "reasons": [], "checks": [], "effective_verdict": "pass"}
    evidence = (EvidenceView("9", "diff", "changes.diff", "text/x-diff", "+x", ("c",)),)
    done = run_task(_view("succeeded", verdict=verdict, evidence=evidence))
    assert [a.artifact_id for a in done.artifacts] == ["verdict", "9"]
    assert done.status.message.parts[0].text == "The verifier accepted the result."
    failed = run_task(_view("failed", verdict=verdict, failure_reason="rejected: no tests"))
    assert list(failed.artifacts) == []
    assert failed.status.message.parts[0].text == "rejected: no tests"
    working = run_task(_view("running"))
    assert not working.status.HasField("message")
    human = run_task(_view("waiting_human", failure_reason="needs a human to accept it"))
    assert human.status.state == S.TASK_STATE_INPUT_REQUIRED
    assert human.status.message.parts[0].text == "needs a human to accept it"


def test_a_goal_template_names_its_inputs() -> None:
    template = (
        "{{ inputs.topic }} {{ inputs['who'] }} {{ inputs.get('note', '') }} "
        "{% for k, v in inputs.items() %}{{ k }}{% endfor %} {{ pattern.key }} {{ event.x }}"
    )
    assert template_inputs(template) == ["note", "topic", "who"]
    assert template_inputs("{{ broken") == []


def test_the_handler_itself_refuses_runs_to_a_caller_without_the_operator_role() -> None:
    # Whatever the ASGI layer lets through (a method name it does not know), starting or
    # cancelling a run is refused where it happens.
    viewer = A2ACaller(user_id=1, username="watcher", can_read=True, can_operate=False)
    context = ServerCallContext(state={CALLER_KEY: viewer, PATTERN_KEY: "brief"})
    handler = PatternRequestHandler()
    message = Message(message_id="m1", role=Role.ROLE_USER, parts=[Part(text="hi")])
    with pytest.raises(InvalidRequestError, match="operator role"):
        asyncio.run(handler.on_message_send(SendMessageRequest(message=message), context))
    with pytest.raises(InvalidRequestError, match="operator role"):
        asyncio.run(handler.on_cancel_task(CancelTaskRequest(id="x"), context))

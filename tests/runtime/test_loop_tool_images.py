"""Images of tool results (``ToolResult.images``) against the loopback model server: an endpoint
that accepts images gets them as ``image_url`` parts of one ``user`` message after the step's
tool messages; one that does not gets only text saying why; a resume rebuilds the same messages
from the journal; context accounting counts an image as a fixed estimate, not its base64."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from runtime.compaction import IMAGE_TOKENS, compact, message_tokens
from runtime.invocation import OutcomeKind
from runtime.loop import ToolLoopInvoker
from runtime.model_images import MAX_DATA_URL_BYTES
from runtime.policy import ToolPolicy
from runtime.tool_images import IMAGES_HEADER, MAX_RESULT_IMAGES, bounded_images, images_message
from runtime.tools import ToolRegistry, ToolResult
from runtime.types import Effect, ToolCall
from tests.runtime.chat_helpers import model_client
from tests.support.fake_model import RecordingTool, make_request
from tests.support.journal import MemoryJournal, SimulatedCrash
from tests.support.model_server import Completion, ModelServer

PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJ"
CHART = ToolResult("Visits of intro:\n[image 1: image/png, about 40 bytes]", images=(PNG,))
CHART_CALL = Completion(tool_calls=[("chart", '{"page": "intro"}')])
NOTE_CALL = Completion(tool_calls=[("note", '{"text": "seen"}')])
DONE = Completion(content="Done.")


def loop(server: ModelServer, *, vision: bool) -> ToolLoopInvoker:
    tools = [RecordingTool("chart", result=CHART), RecordingTool("note", Effect.WRITE)]
    return ToolLoopInvoker(
        model_clients=lambda _username: model_client(server),
        tools=ToolRegistry(tools),
        policy=lambda _request: ToolPolicy.from_decisions({"chart": "allow", "note": "allow"}),
        vision=vision,
        endpoint_name="primary",
    )


def run(invoker: ToolLoopInvoker, journal: MemoryJournal) -> Any:
    return asyncio.run(invoker.invoke(make_request(goal="Chart the intro page."), journal))


def test_an_endpoint_with_vision_gets_the_images_in_a_user_message_after_the_tool_messages(
    model_server: ModelServer,
) -> None:
    model_server.queue(CHART_CALL, DONE)
    journal = MemoryJournal()
    assert run(loop(model_server, vision=True), journal).kind is OutcomeKind.COMPLETED
    *_, assistant, tool, user = model_server.bodies[1]["messages"]
    assert assistant["tool_calls"][0]["function"]["name"] == "chart"
    assert tool == {"role": "tool", "tool_call_id": "call_0", "content": CHART.content}
    assert user == {
        "role": "user",
        "content": [
            {"type": "text", "text": IMAGES_HEADER},
            {"type": "text", "text": "From tool call call_0 (chart):"},
            {"type": "image_url", "image_url": {"url": PNG}},
        ],
    }
    [step] = journal.of_kind("tool")
    assert step.response["images"] == [PNG]  # persisted with the step, for a resume


def test_an_endpoint_without_vision_gets_only_text_saying_why(model_server: ModelServer) -> None:
    model_server.queue(CHART_CALL, DONE)
    journal = MemoryJournal()
    assert run(loop(model_server, vision=False), journal).kind is OutcomeKind.COMPLETED
    last = model_server.bodies[1]["messages"][-1]
    assert last["role"] == "tool" and last["content"].startswith(CHART.content)
    why = "1 image of this result not shown: the model endpoint 'primary' does not accept images"
    assert why in last["content"]
    assert "base64" not in json.dumps(model_server.bodies[1])
    [step] = journal.of_kind("tool")
    assert "images" not in step.response and step.response["content"] == last["content"]


@pytest.mark.parametrize(
    ("operation", "kind", "count", "same_as"),
    [
        ("complete", "tool", 1, 1),  # the chart's result is the last step: settled from it
        ("record", "model", 2, 2),  # a later step follows: the chart's step is replayed
    ],
)
def test_a_resume_rebuilds_the_same_messages_with_the_images(
    model_server: ModelServer, operation: str, kind: str, count: int, same_as: int
) -> None:
    model_server.queue(CHART_CALL, NOTE_CALL, DONE)
    run(loop(model_server, vision=True), MemoryJournal())
    reference = model_server.bodies[same_as]["messages"]
    assert IMAGES_HEADER in json.dumps(reference)

    journal = MemoryJournal()
    journal.crash_after_next(operation, kind, count=count)
    model_server.queue(CHART_CALL, NOTE_CALL, DONE)
    with pytest.raises(SimulatedCrash):
        run(loop(model_server, vision=True), journal)
    crashed = len(model_server.bodies)
    assert run(loop(model_server, vision=True), journal).kind is OutcomeKind.COMPLETED
    assert model_server.bodies[crashed]["messages"] == reference


def test_recorded_images_are_not_sent_after_vision_was_turned_off(
    model_server: ModelServer,
) -> None:
    journal = MemoryJournal()
    journal.crash_after_next("complete", "tool")
    model_server.queue(CHART_CALL, DONE)
    with pytest.raises(SimulatedCrash):
        run(loop(model_server, vision=True), journal)
    assert journal.of_kind("tool")[0].response["images"] == [PNG]
    assert run(loop(model_server, vision=False), journal).kind is OutcomeKind.COMPLETED
    last = model_server.bodies[1]["messages"][-1]
    assert last["role"] == "tool" and "does not accept images" in last["content"]
    assert "base64" not in json.dumps(model_server.bodies[1])


def test_images_are_bounded_and_counted_as_a_fixed_estimate() -> None:
    big = "data:image/png;base64," + "A" * MAX_DATA_URL_BYTES
    kept, notes = bounded_images([PNG, big, "https://example.com/a.png", *[PNG] * 4])
    assert kept == (PNG,) * MAX_RESULT_IMAGES
    assert [n.split(" dropped")[0] for n in notes] == ["[image 2 (image/png, about "
        f"{(MAX_DATA_URL_BYTES * 3) // 4:,} bytes)", "[image 3", "[image 7"]  # fmt: skip
    assert "larger than the 5 MB limit" in notes[0] and "at most 4 images" in notes[2]

    within = "data:image/png;base64," + "A" * (MAX_DATA_URL_BYTES - 100)
    message = images_message([(ToolCall("c1", "chart", "{}"), (within,))])
    assert IMAGE_TOKENS <= message_tokens(message) < IMAGE_TOKENS + 50

    # An old step's images go when its group is pruned; the recent ones stay.
    old = [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "chart"},
        message,
    ]
    recent = [{"role": "user", "content": f"next {n}"} for n in range(4)]
    result = compact([{"role": "system", "content": "s"}, *old, *recent], 200, head=1)
    assert result.messages[3]["content"].startswith("[1 image(s) of the tool results above")
    assert result.pruned_outputs == 1 and result.messages[4:] == recent

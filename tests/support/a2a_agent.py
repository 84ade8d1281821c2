"""A real A2A agent for the client tests, built with ``a2a-sdk`` and served by uvicorn on loopback.

What it does is chosen by the message's first word: ``answer`` completes at once with a text and a
data artifact; ``ask`` asks for input, and the answer on the same task completes it; ``stream``
sends several working updates, then an artifact; ``slow <s>`` works for ``s`` seconds first;
``file`` completes with a CSV file (bytes) and a file named by URL; anything else fails. It counts every message it receives (``messages``) and records each task's end.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from a2a.helpers.proto_helpers import (
    new_data_part,
    new_task_from_user_message,
    new_text_message,
    new_text_part,
)
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events.event_queue_v2 import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Part,
    Role,
    TaskState,
)
from a2a.utils.constants import PROTOCOL_VERSION_1_0, TransportProtocol
from google.protobuf import json_format
from starlette.applications import Starlette


@dataclass
class AgentLog:
    """What the agent saw: every message's text and task id, and how each task ended."""

    messages: list[tuple[str, str]] = field(default_factory=list)
    ended: dict[str, str] = field(default_factory=dict)
    headers: list[dict[str, str]] = field(default_factory=list)
    #: The data parts of the messages, as JSON.
    data: list[Any] = field(default_factory=list)

    def texts(self) -> list[str]:
        return [text for text, _ in self.messages]


class ScriptedAgent(AgentExecutor):
    """The behaviours above; ``log`` is shared with the test."""

    def __init__(self, log: AgentLog) -> None:
        self.log = log

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        text = context.get_user_input().strip()
        task_id, context_id = context.task_id or "", context.context_id or ""
        self.log.messages.append((text, task_id))
        for part in context.message.parts if context.message else []:
            if part.WhichOneof("content") == "data":
                self.log.data.append(json_format.MessageToDict(part.data))
        updater = TaskUpdater(event_queue, task_id, context_id)
        if context.current_task is None and context.message is not None:
            await event_queue.enqueue_event(new_task_from_user_message(context.message))
        current = context.current_task
        if current is not None and current.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            await updater.add_artifact([new_text_part(f"you said: {text}")], name="answer")
            await self._end(updater, task_id, "completed")
            return
        word, _, rest = text.partition(" ")
        await updater.start_work()
        if word == "answer":
            await updater.add_artifact([new_text_part("the answer is 42")], name="text")
            await updater.add_artifact([new_data_part({"answer": 42})], name="data")
            await self._end(updater, task_id, "completed")
        elif word == "file":
            csv = Part(raw=b"colour,count\nblue,3\n", filename="report.csv", media_type="text/csv")
            link = Part(url="https://files.example/big.bin", filename="big.bin")
            await updater.add_artifact([new_text_part("see the files"), csv, link], name="files")
            await self._end(updater, task_id, "completed")
        elif word == "ask":
            question = new_text_message("Which colour?", context_id=context_id, task_id=task_id)
            question.role = Role.ROLE_AGENT
            await updater.requires_input(question)
        elif word in ("stream", "slow"):
            seconds = float(rest or 0) if word == "slow" else 0.0
            steps = 4 if word == "stream" else max(1, int(seconds / 0.2))
            for index in range(steps):
                await asyncio.sleep(0.05 if word == "stream" else 0.2)
                await updater.update_status(
                    TaskState.TASK_STATE_WORKING,
                    new_text_message(f"step {index + 1}", context_id=context_id, task_id=task_id),
                )
            await updater.add_artifact([new_text_part(f"{word} done")], name="result")
            await self._end(updater, task_id, "completed")
        else:
            await updater.failed(new_text_message(f"cannot do {text!r}", context_id=context_id))
            self.log.ended[task_id] = "failed"

    async def _end(self, updater: TaskUpdater, task_id: str, how: str) -> None:
        await updater.complete()
        self.log.ended[task_id] = how

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id = context.task_id or ""
        await TaskUpdater(event_queue, task_id, context.context_id or "").cancel()
        self.log.ended[task_id] = "canceled"


def agent_card(url: str, *, streaming: bool) -> AgentCard:
    return AgentCard(
        name="Scripted agent",
        description="Answers, asks for input, streams.",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(
                url=url,
                protocol_binding=TransportProtocol.JSONRPC.value,
                protocol_version=PROTOCOL_VERSION_1_0,
            )
        ],
        capabilities=AgentCapabilities(streaming=streaming, push_notifications=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain", "application/json"],
        skills=[AgentSkill(id="script", name="script", description="Scripted", tags=["test"])],
    )


@contextmanager
def a2a_agent(*, streaming: bool = True) -> Iterator[tuple[str, AgentLog]]:
    """``(base URL, log)`` of a running agent; its card is at the well-known path."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = AgentLog()
    card = agent_card(url, streaming=streaming)
    handler = DefaultRequestHandler(
        agent_executor=ScriptedAgent(log), task_store=InMemoryTaskStore(), agent_card=card
    )
    inner = Starlette(
        routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")]
    )

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            log.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await inner(scope, receive, send)

    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the A2A agent did not start"
        time.sleep(0.05)
    try:
        yield url, log
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()

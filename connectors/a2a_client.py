"""The A2A protocol side of an external agent: read its card, send a message, follow a task,
cancel it. Plain async code over the official ``a2a-sdk`` client, every connection through the
outbound guard (``outbound_http.async_client``).

A client is opened per operation and closed after it; the only state that matters between
operations is the remote task id, which the caller persists (:class:`TaskFollower`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx2
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from google.protobuf import json_format, struct_pb2

from runtime import outbound, outbound_http
from runtime.model_pool import ssl_context
from runtime.run_artifacts import ToolFile

#: What a call's answer may hold before it is cut (the loop cuts further for the model).
MAX_RESULT_CHARS = 100_000
#: Seconds between two ``tasks/get`` while following a task without streaming.
POLL_SECONDS = 0.5
ENDED = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)
#: States in which the agent waits for the caller: the follow stops there.
WAITING = frozenset({TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED})
#: Their names (``A2ACall.state``).
WAITING_STATES = ("input-required", "auth-required")
#: The names stored in ``A2ACall.state`` and shown to the model.
STATE_NAMES = {
    TaskState.TASK_STATE_UNSPECIFIED: "unknown",
    TaskState.TASK_STATE_SUBMITTED: "submitted",
    TaskState.TASK_STATE_WORKING: "working",
    TaskState.TASK_STATE_COMPLETED: "completed",
    TaskState.TASK_STATE_FAILED: "failed",
    TaskState.TASK_STATE_CANCELED: "canceled",
    TaskState.TASK_STATE_INPUT_REQUIRED: "input-required",
    TaskState.TASK_STATE_REJECTED: "rejected",
    TaskState.TASK_STATE_AUTH_REQUIRED: "auth-required",
}


class InterfaceRefused(ValueError):
    """The card names an interface the agent's headers may not be sent to."""


@dataclass(frozen=True)
class AgentAccess:
    """How to reach one agent now: its card URL, timeout and header values."""

    name: str
    card_url: str
    timeout_seconds: float
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class TaskOutcome:
    """Where a followed task stopped: its id, context, state name, and what it said."""

    task_id: str
    context_id: str
    state: str
    #: The artifacts' parts as text (data parts as JSON, files described).
    text: str
    #: The status message's text (the question when input is required, the reason on failure).
    status_text: str
    #: The file parts of the artifacts, each with a source id unique within the task.
    files: tuple[tuple[str, ToolFile], ...] = ()


def _split_card_url(card_url: str) -> tuple[str, str]:
    """``(base URL, card path)``: a URL ending in ``.json`` names the card itself, any other URL
    is the agent's base, whose card sits at the well-known path."""
    if card_url.rstrip("/").endswith(".json"):
        base, _, name = card_url.rstrip("/").rpartition("/")
        return base, name
    return card_url.rstrip("/"), "/.well-known/agent-card.json"


@asynccontextmanager
async def _http(access: AgentAccess) -> AsyncIterator[httpx2.AsyncClient]:
    policy = outbound.current_policy()
    outbound.check_url(access.card_url, policy)  # static checks; each connection is checked too
    http = outbound_http.async_client(policy, verify=ssl_context())
    http.headers.update(dict(access.headers))
    http.timeout = httpx2.Timeout(access.timeout_seconds)
    async with http:
        yield http


async def read_card(access: AgentAccess) -> dict[str, Any]:
    """The agent's card as JSON (what is stored and shown)."""
    async with _http(access) as http:
        card = await _card(http, access)
    return json_format.MessageToDict(card)


async def _card(http: httpx2.AsyncClient, access: AgentAccess) -> AgentCard:
    base, path = _split_card_url(access.card_url)
    # httpx2 keeps httpx's client interface, which is all the SDK uses.
    resolver = A2ACardResolver(http, base, agent_card_path=path)  # type: ignore[arg-type]
    return await resolver.get_agent_card()


@asynccontextmanager
async def _client(access: AgentAccess, card_json: Mapping[str, Any]) -> AsyncIterator[Client]:
    """An SDK client for the card as last read (the interface URL is checked by the guard)."""
    card = json_format.ParseDict(dict(card_json), AgentCard(), ignore_unknown_fields=True)
    for interface in card.supported_interfaces:
        outbound.check_url(interface.url, outbound.current_policy())
        if access.headers and _origin(interface.url) != _origin(access.card_url):
            # The card is the agent's word: it must not send our credentials elsewhere.
            raise InterfaceRefused(
                f"the card's interface {interface.url} is not on the card's host "
                f"({_origin(access.card_url)}); the agent's headers are sent only there"
            )
    async with _http(access) as http:
        streaming = card.capabilities.streaming
        # Without streaming, the send returns at once (returnImmediately) and the task is then
        # polled: a blocking send would hide the task id until the task had ended.
        config = ClientConfig(
            httpx_client=http,  # type: ignore[arg-type]  # httpx2 keeps httpx's interface
            streaming=streaming,
            polling=not streaming,
        )
        client = ClientFactory(config).create(card)
        try:
            yield client
        finally:
            await client.close()


def _origin(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme, 0)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"


def new_message(
    text: str, data: Mapping[str, Any] | None, *, message_id: str, task_id: str, context_id: str
) -> Message:
    """A user message: the text, then the data part; on an existing task when ids are given."""
    parts = [Part(text=text)]
    if data:
        parts.append(Part(data=json_format.ParseDict(dict(data), struct_pb2.Value())))
    return Message(
        message_id=message_id, role=Role.ROLE_USER, parts=parts, task_id=task_id,
        context_id=context_id,
    )  # fmt: skip


OnTask = Callable[[str, str, str], Awaitable[None]]


class TaskFollower:
    """Sends or resumes one task and follows it until it ends or waits for input.

    ``on_task(task_id, context_id, state)`` is awaited whenever the task's id or state is first
    seen or changes, so the caller can persist the id before waiting any further."""

    def __init__(self, access: AgentAccess, card: Mapping[str, Any], on_task: OnTask) -> None:
        self.access = access
        self.card = card
        self.on_task = on_task
        self._task = Task()
        self._seen: tuple[str, int] = ("", -1)
        #: The status that asked the question being answered: waiting on it is not the answer.
        self._asked: tuple[int, str, str] | None = None

    def _settled(self) -> bool:
        """The task ended, or waits for input on a question other than the one answered."""
        state = self._task.status.state
        return state in ENDED or (state in WAITING and _status_key(self._task) != self._asked)

    async def send(self, message: Message) -> TaskOutcome:
        async with _client(self.access, self.card) as client:
            return await self._send(client, message)

    async def _send(self, client: Client, message: Message) -> TaskOutcome:
        async for event in client.send_message(SendMessageRequest(message=message)):
            if event.HasField("message"):
                return _direct_answer(event.message, message)
            await self._absorb(event)
            if self._settled():
                break
        return await self._poll(client)

    async def answer(self, message: Message) -> TaskOutcome:
        """Send a person's answer to the task ``message`` names, which waits for input, and
        follow it on; a task that no longer waits is followed without sending anything."""
        self._task.id = message.task_id
        async with _client(self.access, self.card) as client:
            await self._get(client)
            if self._task.status.state not in WAITING:
                return await self._poll(client)
            self._asked = _status_key(self._task)
            return await self._send(client, message)

    async def resume(self, task_id: str, streaming: bool) -> TaskOutcome:
        """Follow ``task_id`` again (after a crash): subscribe when the agent streams, else
        poll; never sends a message."""
        self._task.id = task_id
        async with _client(self.access, self.card) as client:
            await self._get(client)
            if streaming and not self._settled():
                async for event in client.subscribe(SubscribeToTaskRequest(id=task_id)):
                    await self._absorb(event)
                    if self._settled():
                        break
            return await self._poll(client)

    async def _get(self, client: Client) -> None:
        task = await client.get_task(GetTaskRequest(id=self._task.id))
        self._task = task
        await self._noticed()

    async def _poll(self, client: Client) -> TaskOutcome:
        """``tasks/get`` until the task ends or waits; the caller's timeout bounds it."""
        await self._get(client)
        while not self._settled():
            await asyncio.sleep(POLL_SECONDS)
            await self._get(client)
        return self._outcome()

    async def _absorb(self, event: StreamResponse) -> None:
        if event.HasField("task"):
            self._task = Task()
            self._task.CopyFrom(event.task)
        elif event.HasField("status_update"):
            update = event.status_update
            self._task.id = self._task.id or update.task_id
            self._task.context_id = self._task.context_id or update.context_id
            self._task.status.CopyFrom(update.status)
        elif event.HasField("artifact_update"):
            update = event.artifact_update
            self._task.id = self._task.id or update.task_id
            self._task.context_id = self._task.context_id or update.context_id
            _merge_artifact(self._task, update.artifact, append=update.append)
        await self._noticed()

    async def _noticed(self) -> None:
        seen = (self._task.id, int(self._task.status.state))
        if self._task.id and seen != self._seen:
            self._seen = seen
            await self.on_task(self._task.id, self._task.context_id, _state(self._task))

    def _outcome(self) -> TaskOutcome:
        task = self._task
        texts = [_parts_text(artifact.parts) for artifact in task.artifacts]
        return TaskOutcome(
            task_id=task.id,
            context_id=task.context_id,
            state=_state(task),
            text=_cut("\n".join(t for t in texts if t)),
            status_text=_cut(_parts_text(task.status.message.parts)),
            files=tuple(_files(task.artifacts)),
        )


async def cancel_task(access: AgentAccess, card: Mapping[str, Any], task_id: str) -> str:
    """``tasks/cancel``; the state the agent reports after it."""
    async with _client(access, card) as client:
        task = await client.cancel_task(CancelTaskRequest(id=task_id))
    return _state(task)


def _status_key(task: Task) -> tuple[int, str, str]:
    """What tells one status of a task from another: state, time and message."""
    status = task.status
    stamp = status.timestamp.ToJsonString() if status.HasField("timestamp") else ""
    return int(status.state), stamp, status.message.message_id


def _state(task: Task) -> str:
    return STATE_NAMES.get(task.status.state, "unknown")


def _direct_answer(answer: Message, sent: Message) -> TaskOutcome:
    """An agent that answers with a message, not a task: it is complete at once."""
    return TaskOutcome(
        task_id="", context_id=answer.context_id or sent.context_id, state="completed",
        text=_cut(_parts_text(answer.parts)), status_text="",
    )  # fmt: skip


def _merge_artifact(task: Task, artifact: Any, *, append: bool) -> None:
    for existing in task.artifacts:
        if existing.artifact_id == artifact.artifact_id:
            if append:
                existing.parts.extend(artifact.parts)
            else:
                existing.CopyFrom(artifact)
            return
    task.artifacts.append(artifact)


def _parts_text(parts: Any) -> str:
    """Text parts as they are, data parts as JSON, file parts described by name, type and
    size."""
    out: list[str] = []
    for part in parts:
        kind = part.WhichOneof("content")
        if kind == "text":
            out.append(part.text)
        elif kind == "data":
            value = _whole_numbers(json_format.MessageToDict(part.data))
            out.append(json.dumps(value, ensure_ascii=False, sort_keys=True))
        elif kind == "raw":
            name = part.filename or "unnamed"
            out.append(f"[file {name} ({part.media_type or 'unknown type'}, {len(part.raw)} "
                       "bytes), not shown]")  # fmt: skip
        elif kind == "url":
            out.append(f"[file {part.filename or part.url} at {part.url}]")
    return "\n".join(out)


def _files(artifacts: Any) -> list[tuple[str, ToolFile]]:
    """The file parts (bytes or a URL) of ``artifacts``, with ``<artifact id>:<part index>``."""
    found = []
    for artifact in artifacts:
        for index, part in enumerate(artifact.parts):
            kind = part.WhichOneof("content")
            name = part.filename or artifact.name or "unnamed"
            source = f"{artifact.artifact_id}:{index}"
            if kind == "raw":
                found.append((source, ToolFile(name, part.media_type, content=bytes(part.raw))))
            elif kind == "url":
                found.append((source, ToolFile(name, part.media_type, url=part.url)))
    return found


def _whole_numbers(value: Any) -> Any:
    """``42.0`` → ``42``: a data part's numbers all arrive as floats (``google.protobuf.Value``)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {key: _whole_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(item) for item in value]
    return value


def _cut(text: str) -> str:
    if len(text) > MAX_RESULT_CHARS:
        return text[:MAX_RESULT_CHARS] + f"\n[cut at {MAX_RESULT_CHARS} characters]"
    return text

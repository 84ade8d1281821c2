"""The A2A request handler of served patterns: the SDK's JSON-RPC dispatcher calls it with the
caller and the pattern of the request (``ServerCallContext.state``, put there by
:mod:`a2a_server.asgi`); the work is done by :mod:`a2a_server.services` on a pool thread.

Following a task polls its run (the database is the source of truth, as for the UI's live
streams): ``SendMessage`` waits until the task is completed, failed, canceled or needs input
(or returns at once with ``returnImmediately``), a stream ends there too; both give up after
``WAIT_SECONDS`` and answer the task as it is then (follow it with ``GetTask`` or
``SubscribeToTask``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any, TypeVar

from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers.request_handler import RequestHandler, validate_request_params
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import (
    A2AError,
    InvalidParamsError,
    InvalidRequestError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.task import apply_history_length, validate_history_length
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection

from a2a_server.protocol import (
    INTERRUPTED_STATES,
    TERMINAL_STATES,
    message_inputs,
    run_task,
    task_artifacts,
    task_state,
    task_status,
)
from a2a_server.records import A2ACaller, RunView
from a2a_server.services import (
    MAX_CONTEXT_ID,
    a2a_run_cancel,
    a2a_run_start,
    a2a_run_view,
)
from orchestrator.errors import Conflict, DomainError, InvalidInput, NotFound

T = TypeVar("T")
DEFAULTS: dict[str, float] = {"POLL_SECONDS": 1.0, "WAIT_SECONDS": 300.0, "HEARTBEAT_SECONDS": 4.0}
CALLER_KEY = "loopwright_caller"
PATTERN_KEY = "loopwright_pattern"


def timing() -> tuple[float, float, float]:
    """(poll, wait, heartbeat) seconds from ``settings.LOOPWRIGHT_A2A`` (optional) over
    DEFAULTS."""
    conf = {**DEFAULTS, **getattr(settings, "LOOPWRIGHT_A2A", {})}
    return (
        float(conf["POLL_SECONDS"]),
        float(conf["WAIT_SECONDS"]),
        float(conf["HEARTBEAT_SECONDS"]),
    )


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn`` on a pool thread whose database connection is closed when it returns."""

    def call() -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            connection.close()

    return await sync_to_async(call, thread_sensitive=False)()


def as_a2a_error(exc: DomainError) -> A2AError:
    """A service's refusal as a JSON-RPC error: bad input is ``InvalidParams`` (-32602) with
    the problem's pointers, a refusal to start (disabled pattern, spent budget, open breaker)
    ``InvalidRequest`` (-32600) with the problem's fields, a missing pattern ``TaskNotFound``."""
    if isinstance(exc, InvalidInput):
        errors = [
            {"field": str(e.get("pointer", "")), "message": str(e.get("detail", ""))}
            for e in exc.extra.get("errors", [])
            if isinstance(e, dict)
        ]
        return InvalidParamsError(message=exc.detail, data={"errors": errors} if errors else None)
    if isinstance(exc, NotFound):
        return TaskNotFoundError(message=exc.detail)
    data = {"status": str(exc.status_code), "problem": exc.problem_type}
    return InvalidRequestError(message=exc.detail, data=data)


def _caller(context: ServerCallContext) -> A2ACaller:
    caller = context.state.get(CALLER_KEY)
    if not isinstance(caller, A2ACaller):  # only reachable if the ASGI layer was bypassed
        raise InvalidRequestError(message="No authenticated caller.")
    return caller


def _operator(context: ServerCallContext) -> A2ACaller:
    """The caller, who must hold the operator role: starting and cancelling runs (checked again
    here, where the run starts or ends, whatever the ASGI layer let through)."""
    caller = _caller(context)
    if not caller.can_operate:
        raise InvalidRequestError(message="Starting or cancelling runs needs the operator role.")
    return caller


def _pattern(context: ServerCallContext) -> str:
    return str(context.state[PATTERN_KEY])


def _context_id(message: Message) -> str:
    if len(message.context_id) > MAX_CONTEXT_ID:
        raise InvalidParamsError(
            message=f"contextId is longer than {MAX_CONTEXT_ID} characters.",
            data={"errors": [{"field": "message.contextId", "message": "too long"}]},
        )
    return message.context_id or uuid.uuid4().hex


def _shown(view: RunView) -> tuple[int, str, tuple[str, ...]]:
    """What a follower is told of: the task state and, but while working, the run's status
    and the calls waiting for approval."""
    state = task_state(view.status)
    if state == TaskState.TASK_STATE_WORKING:
        return int(state), "", ()
    return int(state), view.status, view.pending_tools


class PatternRequestHandler(RequestHandler):
    """Tasks are runs of the request's pattern; push notifications and task lists are not
    offered (``UnsupportedOperation``)."""

    async def _view(self, context: ServerCallContext, task_id: str) -> RunView:
        view = await in_thread(a2a_run_view, pattern_key=_pattern(context), task_id=task_id)
        if view is None:
            raise TaskNotFoundError(message=f"No task {task_id!r} of this agent.")
        return view

    @validate_request_params
    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task:
        validate_history_length(params)
        return apply_history_length(run_task(await self._view(context, params.id)), params)

    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        raise UnsupportedOperationError(message="Listing tasks is not offered; use GetTask.")

    @validate_request_params
    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task:
        caller = _operator(context)
        try:
            view = await in_thread(
                a2a_run_cancel,
                pattern_key=_pattern(context),
                task_id=params.id,
                actor=caller.username,
            )
        except Conflict as exc:
            raise TaskNotCancelableError(message=exc.detail) from exc
        if view is None:
            raise TaskNotFoundError(message=f"No task {params.id!r} of this agent.")
        return run_task(view)

    async def _start(self, params: SendMessageRequest, context: ServerCallContext) -> RunView:
        validate_history_length(params.configuration)
        message = params.message
        if message.task_id:
            raise UnsupportedOperationError(
                message=(
                    "Each message starts a new run; a message to an existing task is not taken "
                    "(approvals and acceptances are decided in Loopwright)."
                )
            )
        inputs = message_inputs(message)
        try:
            return await in_thread(
                a2a_run_start,
                pattern_key=_pattern(context),
                caller=_operator(context),
                inputs=inputs,
                context_id=_context_id(message),
            )
        except DomainError as exc:
            raise as_a2a_error(exc) from exc

    @validate_request_params
    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        view = await self._start(params, context)
        if not params.configuration.return_immediately:
            async for _event in self._follow(context, view, stop_at_start=True):
                pass
            view = await self._view(context, view.id)
        return apply_history_length(run_task(view), params.configuration)

    @validate_request_params
    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        view = await self._start(params, context)
        async for event in self._follow(context, view, stop_at_start=True):
            yield event

    @validate_request_params
    async def on_subscribe_to_task(
        self, params: Any, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        view = await self._view(context, params.id)
        if task_state(view.status) in TERMINAL_STATES:
            raise UnsupportedOperationError(message=f"Task {params.id} has ended.")
        async for event in self._follow(context, view, stop_at_start=False):
            yield event

    async def _follow(
        self, context: ServerCallContext, view: RunView, *, stop_at_start: bool
    ) -> AsyncGenerator[Event]:
        """The task now, then its changes until it ends or comes to need input (at once when
        it needs input from the start and ``stop_at_start``), or until the wait is over. With
        no change for ``HEARTBEAT_SECONDS`` the status is sent again (a fresh timestamp), so an
        HTTP client's read timeout (5 s in httpx by default) does not cut a long run's stream."""
        poll, wait, heartbeat = timing()
        deadline = time.monotonic() + wait
        yield run_task(view)
        changed, sent = stop_at_start, time.monotonic()
        while True:
            state = task_state(view.status)
            if state in TERMINAL_STATES or (changed and state in INTERRUPTED_STATES):
                return
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(poll)
            now = await self._view(context, view.id)
            if _shown(now) == _shown(view):
                view = now
                if time.monotonic() - sent >= heartbeat:
                    sent = time.monotonic()
                    yield TaskStatusUpdateEvent(
                        task_id=view.id, context_id=view.context_id, status=task_status(view)
                    )
                continue
            changed, view, sent = True, now, time.monotonic()
            for artifact in task_artifacts(view):
                yield TaskArtifactUpdateEvent(
                    task_id=view.id, context_id=view.context_id, artifact=artifact, last_chunk=True
                )
            yield TaskStatusUpdateEvent(
                task_id=view.id, context_id=view.context_id, status=task_status(view)
            )

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        raise UnsupportedOperationError(message="This agent has no extended card.")

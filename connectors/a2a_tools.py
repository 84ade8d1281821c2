"""External A2A agents as agent tools: ``a2a__<agent>`` (docs/interop.md).

:class:`A2AToolProvider` offers one tool per enabled agent whose card was read, with the
agent's trust tier (``effect``) as the tool's effect. A call creates (or, re-issued, finds) its
:class:`~connectors.models.A2ACall` row by the call's idempotency key first. A row that names a
remote task is followed again (subscribe or ``tasks/get``), never sent again; a row marked sent
without a task id is an unknown outcome and is not re-sent either. Otherwise the message is
sent and the remote task id written to the row as soon as the agent reports it.

A completed task gives its artifacts (text, data as JSON, files described) as the result;
failed, rejected, cancelled, auth-required and timed-out tasks are error results the model
reads. A task that asks for input (``input-required``) makes the call ask a person
(``ToolResult.input_request``: the run parks with the question in the approvals inbox); the
call then runs again with the answer, which is sent on the same task (once: the row records the
answering approval's key before it is sent), and follows the task on. A call cancelled because
its run was cancelled cancels the remote task. Failures count on the agent's circuit breaker
(``a2a-agent:<name>``), shared by every process.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from connectors.a2a_client import (
    AgentAccess,
    InterfaceRefused,
    TaskFollower,
    TaskOutcome,
    cancel_task,
    new_message,
)
from connectors.a2a_services import (
    a2a_call_answering,
    a2a_call_open,
    a2a_call_sending,
    a2a_call_task,
    agent_access,
)
from connectors.models import A2AAgent, A2ACall
from connectors.offered import OfferedTools
from connectors.services import failure_reason
from connectors.tools import BREAKER_COOLDOWN_SECONDS, breaker_failed
from harness.planner import A2A_PREFIX
from orchestrator.dbthreads import OffLoopDb
from runtime.outbound import OutboundRefused
from runtime.reach import network_refusal
from runtime.run_artifacts import store_run_artifact
from runtime.run_cancellation import run_was_canceled
from runtime.tools.base import Tool, ToolContext, ToolResult
from runtime.tools.bash import call_network
from runtime.types import Effect, ToolSpec

CACHE_SECONDS = 2.0
#: How long cancelling a remote task may take when the run is cancelled.
CANCEL_SECONDS = 5.0
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "message": {"type": "string", "minLength": 1, "description": "What to ask the agent."},
        "data": {"type": "object", "description": "Structured input sent as a data part."},
    },
    "required": ["message"],
    "additionalProperties": False,
}
logger = logging.getLogger(__name__)
_THREADS = OffLoopDb("a2a-tools")


@dataclass(frozen=True)
class OfferedAgent:
    """One offered agent: its tool spec and name."""

    spec: ToolSpec
    agent: str


def offered_agent(agent: A2AAgent) -> OfferedAgent | None:
    """The tool ``agent`` is offered as, or None until its card has been read."""
    if not agent.card:
        return None
    card = agent.card
    skills = "; ".join(
        f"{s.get('name') or s.get('id')}: {s.get('description', '')}"
        for s in card.get("skills", [])
    )
    description = f"[A2A agent {agent.name}] {card.get('description', '')} Skills: {skills}"
    spec = ToolSpec(
        name=f"{A2A_PREFIX}{agent.name}",
        description=description[:1024],
        parameters=PARAMETERS,
        effect=Effect(agent.effect),
    )
    return OfferedAgent(spec, agent.name)


def _load() -> dict[str, OfferedAgent]:
    found: dict[str, OfferedAgent] = {}
    for agent in A2AAgent.objects.filter(enabled=True):
        offered = offered_agent(agent)
        if offered is not None:
            found[offered.spec.name] = offered
    return found


class A2AToolProvider(OfferedTools[OfferedAgent]):
    """The A2A agent tools of the production registry."""

    def __init__(self, cache_seconds: float = CACHE_SECONDS) -> None:
        super().__init__(_load, _THREADS, cache_seconds)

    def get(self, name: str) -> Tool | None:
        if not name.startswith(A2A_PREFIX):
            return None
        offered = self.offered().get(name)
        return None if offered is None else A2ATool(offered, self)


A2A_TOOLS = A2AToolProvider()


@dataclass(frozen=True)
class _Prepared:
    access: AgentAccess
    card: Mapping[str, Any]
    call: A2ACall


def _prepare(name: str, key: str) -> _Prepared | str:
    """The agent's access and card, and the call's row (created or found), on a thread."""
    agent = A2AAgent.objects.filter(name=name, enabled=True).first()
    if agent is None:
        return f"A2A agent {name!r} is not registered or is disabled."
    access = agent_access(agent)
    if isinstance(access, str):
        return f"A2A agent {name!r}: {access}"
    return _Prepared(access, agent.card, a2a_call_open(idempotency_key=key, agent=agent))


def _checked(arguments: dict[str, Any]) -> tuple[str, dict[str, Any] | None] | str:
    message, data = arguments.get("message"), arguments.get("data")
    if not isinstance(message, str) or not message.strip():
        return "message must be a non-empty string."
    if data is not None and not isinstance(data, dict):
        return "data must be a JSON object."
    return message, data


class A2ATool:
    """One external agent: a call sends a message (or resumes its task) and follows the task."""

    def __init__(self, offered: OfferedAgent, provider: A2AToolProvider) -> None:
        self.offered = offered
        self.provider = provider

    @property
    def spec(self) -> ToolSpec:
        return self.offered.spec

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        name = self.offered.agent
        checked = _checked(arguments)
        if isinstance(checked, str):
            return ToolResult(f"Error: {checked}", is_error=True)
        prepared = await _THREADS.run(functools.partial(_prepare, name, context.call_key))
        if isinstance(prepared, str):
            return ToolResult(f"Error: {prepared}", is_error=True)
        interfaces = [i.get("url", "") for i in prepared.card.get("supportedInterfaces") or []]
        refusal = network_refusal([prepared.access.card_url, *interfaces], *call_network(context))
        if refusal:
            return ToolResult(f"Error: A2A agent {name} is out of reach: {refusal}.", is_error=True)
        call = prepared.call
        if call.sent_at is not None and not call.task_id:
            return ToolResult(
                f"Error: the earlier call of {self.spec.name} was interrupted while its message "
                "was being sent, and the agent named no task; it was not sent again, since the "
                "agent may have received it. Check with the agent before asking again.",
                is_error=True,
            )
        breaker = self.provider.breaker()
        admission = await breaker.admit(
            f"a2a-agent:{name}", probe_lease=prepared.access.timeout_seconds + 5
        )
        if not admission.allowed:
            wait = f"; next try in {admission.retry_in:.0f} s" if admission.retry_in else ""
            return ToolResult(
                f"Error: A2A agent {name} is unavailable (its circuit is open{wait}). "
                "Carry on without it or try later.",
                is_error=True,
            )
        follow = _Follow(prepared, context)
        timeout = max(0.1, min(prepared.access.timeout_seconds, context.remaining()))
        try:
            async with asyncio.timeout(timeout):
                outcome = await follow.run(*checked)
        except asyncio.CancelledError:
            await follow.cancel_if_run_canceled()
            raise
        except (OutboundRefused, InterfaceRefused) as exc:  # our rule, not the agent's failure
            await breaker.record_success(admission, cooldown=BREAKER_COOLDOWN_SECONDS)
            return ToolResult(f"Error: A2A agent {name} refused: {exc}", is_error=True)
        except TimeoutError:
            await breaker_failed(breaker, admission)
            state = await follow.cancel_remote()
            return ToolResult(
                f"Error: A2A agent {name} did not finish within {timeout:g} s; its task "
                f"{follow.task_id or '(none)'} was cancelled ({state}).",
                is_error=True,
            )
        except Exception as exc:  # transport, protocol: the agent failed this call
            await breaker_failed(breaker, admission)
            reason = failure_reason(exc)
            logger.warning("A2A %s: call failed: %s", name, reason)
            return ToolResult(f"Error: A2A agent {name} failed: {reason}", is_error=True)
        await breaker.record_success(admission, cooldown=BREAKER_COOLDOWN_SECONDS)
        result = _result(name, outcome)
        if outcome.state == "completed" and outcome.files:
            kept = await _keep_files(outcome, context)
            result = ToolResult("\n".join([result.content, *kept]))
        return result


class _Follow:
    """One call's traffic with the agent; the remote task id is kept here and on the row."""

    def __init__(self, prepared: _Prepared, context: ToolContext) -> None:
        self.prepared = prepared
        self.context = context
        self.task_id = prepared.call.task_id

    async def _on_task(self, task_id: str, context_id: str, state: str) -> None:
        self.task_id = task_id
        # Written before the follow goes on: a worker that dies now resumes this task.
        await _THREADS.run(
            functools.partial(
                a2a_call_task,
                call=self.prepared.call,
                task_id=task_id,
                context_id=context_id,
                state=state,
            )
        )

    async def run(self, text: str, data: dict[str, Any] | None) -> TaskOutcome:
        prepared = self.prepared
        follower = TaskFollower(prepared.access, prepared.card, self._on_task)
        key, call = self.context.idempotency_key, prepared.call
        if self.context.answer and call.task_id and call.answered_key != key:
            await _THREADS.run(functools.partial(a2a_call_answering, call=call, key=key))
            answer = new_message(
                self.context.answer,
                None,
                message_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"loopwright:{key}:answer")),
                task_id=call.task_id,
                context_id=call.context_id,
            )
            return await follower.answer(answer)
        if prepared.call.task_id:
            streaming = bool((prepared.card.get("capabilities") or {}).get("streaming"))
            return await follower.resume(prepared.call.task_id, streaming)
        await _THREADS.run(functools.partial(a2a_call_sending, call=prepared.call))
        # The message id is derived from the idempotency key: an agent that deduplicates by
        # message id sees one message even in the crash window before the task id is known.
        message_id = str(
            uuid.uuid5(uuid.NAMESPACE_URL, f"loopwright:{self.context.idempotency_key}")
        )
        message = new_message(text, data, message_id=message_id, task_id="", context_id="")
        return await follower.send(message)

    async def cancel_remote(self) -> str:
        """``tasks/cancel`` of the remote task, bounded; its state after, or why not."""
        if not self.task_id:
            return "no task to cancel"
        try:
            async with asyncio.timeout(CANCEL_SECONDS):
                state = await cancel_task(self.prepared.access, self.prepared.card, self.task_id)
        except Exception as exc:
            logger.warning("A2A task %s: cancel failed: %s", self.task_id, failure_reason(exc))
            return f"cancel failed: {failure_reason(exc)}"
        await self._on_task(self.task_id, self.prepared.call.context_id, state)
        return state

    async def cancel_if_run_canceled(self) -> None:
        """On cancellation: cancel the remote task only when the run itself was cancelled (a
        pause, a lost lease or a draining worker resumes this call later)."""
        invocation = self.context.invocation
        if invocation is None or not self.task_id:
            return
        try:
            canceled = await _THREADS.run(functools.partial(run_was_canceled, invocation.run_id))
        except Exception as exc:
            logger.warning(
                "run %s: cannot tell whether it was cancelled: %s", invocation.run_id, exc
            )
            return
        if canceled:
            await self.cancel_remote()


async def _keep_files(outcome: TaskOutcome, context: ToolContext) -> list[str]:
    """Store the task's files as artifacts of the calling run; a line for each, to append."""
    lines = []
    for source, file in outcome.files:
        stored = None
        if context.invocation is not None:
            stored = await _THREADS.run(
                functools.partial(
                    store_run_artifact,
                    context.invocation.run_id,
                    f"{context.call_key}:{outcome.task_id}:{source}",
                    file,
                )
            )
        where = f"kept as run artifact {stored}" if stored else "not kept (no run, or too large)"
        lines.append(f"[file {file.name}: {where}]")
    return lines


def _result(name: str, outcome: TaskOutcome) -> ToolResult:
    if outcome.state == "completed":
        return ToolResult(outcome.text or outcome.status_text or "(no content)")
    said = f": {outcome.status_text}" if outcome.status_text else ""
    if outcome.state == "input-required":
        question = outcome.status_text or "(the agent gave no question)"
        return ToolResult(
            f"A2A agent {name} asks for input on task {outcome.task_id}: {question}",
            input_request=f"A2A agent {name} asks: {question}",
        )
    if outcome.state == "auth-required":
        return ToolResult(
            f"Error: A2A agent {name} needs credentials to go on with task {outcome.task_id} "
            f"(auth-required){said}; the task was left waiting. Its registration's headers "
            "must carry them.",
            is_error=True,
        )
    return ToolResult(
        f"Error: A2A agent {name}: task {outcome.task_id} ended {outcome.state}{said}",
        is_error=True,
    )

"""Runs and patterns in A2A's terms, pure: a message's parts → a run's inputs, a run's status →
a task state, a run → a task (the verifier's verdict and evidence as artifacts), a pattern →
its agent card.

Task states: a run being worked on (queued, preparing, waiting for a lock, running,
verifying) is ``working``; a run parked until a human acts (an approval, an acceptance or
escalation, a pause, a spent budget) is ``input-required``; then ``completed``, ``failed``,
``canceled``.
"""

from __future__ import annotations

import json
import math
from typing import Any

from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentProvider,
    AgentSkill,
    Artifact,
    HTTPAuthSecurityScheme,
    Message,
    Part,
    Role,
    SecurityRequirement,
    SecurityScheme,
    StringList,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.constants import PROTOCOL_VERSION_0_3, PROTOCOL_VERSION_1_0, TransportProtocol
from a2a.utils.errors import InvalidParamsError
from google.protobuf import json_format, struct_pb2

from a2a_server.records import EvidenceView, RunView, ServedPattern
from orchestrator.jsonlimits import JsonRefused, loads_bounded

WORKING = frozenset({"queued", "preparing", "waiting_lock", "running", "verifying"})
INPUT_REQUIRED = frozenset({"waiting_approval", "waiting_human", "paused", "blocked"})
_ENDED = {
    "succeeded": TaskState.TASK_STATE_COMPLETED,
    "failed": TaskState.TASK_STATE_FAILED,
    "canceled": TaskState.TASK_STATE_CANCELED,
}
TERMINAL_STATES = frozenset(_ENDED.values())
INTERRUPTED_STATES = frozenset({TaskState.TASK_STATE_INPUT_REQUIRED})
SECURITY_SCHEME = "loopwrightToken"
MEDIA_TYPES = ["application/json", "text/plain"]


def task_state(status: str) -> TaskState:
    """The A2A task state of a run status (module docstring)."""
    if status in _ENDED:
        return _ENDED[status]
    if status in INPUT_REQUIRED:
        return TaskState.TASK_STATE_INPUT_REQUIRED
    if status in WORKING:
        return TaskState.TASK_STATE_WORKING
    raise ValueError(f"unknown run status {status!r}")


# --- message → inputs ----------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """JSON from a protobuf ``Value``: its numbers are all doubles, so whole ones become ints."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _invalid(detail: str, field: str) -> InvalidParamsError:
    return InvalidParamsError(
        message=detail, data={"errors": [{"field": field, "message": detail}]}
    )


def message_inputs(message: Message) -> dict[str, Any]:
    """A run's inputs from a message: its data part (a JSON object), else its text when the
    text is a JSON object, else ``{"message": text}``. InvalidParamsError otherwise."""
    data = [part for part in message.parts if part.HasField("data")]
    if len(data) > 1:
        raise _invalid("Send at most one data part: it is the run's inputs.", "message.parts")
    if data:
        value = _plain(json_format.MessageToDict(data[0].data))
        if not isinstance(value, dict):
            raise _invalid("The data part must be a JSON object (the run's inputs).", "data")
        return value
    texts = [part.text for part in message.parts if part.HasField("text")]
    text = "\n".join(texts)
    if not text.strip():
        raise _invalid(
            "The message needs a data part (a JSON object) or text; files and URLs are not "
            "taken as inputs.",
            "message.parts",
        )
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            parsed = loads_bounded(stripped)
        except JsonRefused as exc:
            raise _invalid(f"The text's JSON is refused: {exc.detail}", "text") from exc
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    return {"message": text}


# --- run → task ----------------------------------------------------------------------------


def _struct(values: dict[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(json.loads(json.dumps(values, default=str)))
    return struct


def _status_text(view: RunView) -> str:
    if view.status == "waiting_approval":
        tools = ", ".join(view.pending_tools) or "a tool call"
        return f"Waiting for a human to approve: {tools}. Approvals are decided in Loopwright."
    if view.status in INPUT_REQUIRED:
        return view.failure_reason or f"The run is {view.status}; a human must act on it."
    if view.status == "succeeded":
        return "The verifier accepted the result." if view.verdict else "The run succeeded."
    return view.failure_reason or view.terminal_reason or ""


def task_status(view: RunView) -> TaskStatus:
    """The task's status: its state, the run's time of change and, but while working, a
    message saying why (the approval it waits on, the failure, the cancellation)."""
    status = TaskStatus(state=task_state(view.status))
    status.timestamp.FromDatetime(view.updated_at)
    text = "" if view.status in WORKING else _status_text(view)
    if text:
        status.message.CopyFrom(
            Message(
                message_id=f"{view.id}:{view.status}",
                context_id=view.context_id,
                task_id=view.id,
                role=Role.ROLE_AGENT,
                parts=[Part(text=text)],
            )
        )
    return status


def _evidence_artifact(item: EvidenceView) -> Artifact:
    return Artifact(
        artifact_id=item.id,
        name=item.name,
        description=f"Evidence for the check(s): {', '.join(item.checks)}",
        parts=[Part(text=item.content, media_type=item.content_type, filename=item.name)],
        metadata=_struct({"kind": item.kind, "checks": list(item.checks)}),
    )


def task_artifacts(view: RunView) -> list[Artifact]:
    """For a completed run: the verifier's verdict (a data part), then each artifact its
    checks cite as evidence; nothing for any other state."""
    if view.status != "succeeded" or view.verdict is None:
        return []
    keys = ("verdict", "effective_verdict", "reasons", "checks", "problems")
    verdict = {k: view.verdict[k] for k in keys if k in view.verdict}
    value = json_format.ParseDict(json.loads(json.dumps(verdict, default=str)), struct_pb2.Value())
    first = Artifact(
        artifact_id="verdict",
        name="verdict",
        description="The verifier's verdict: its checks and the evidence each cites.",
        parts=[Part(data=value, media_type="application/json")],
    )
    return [first, *(_evidence_artifact(item) for item in view.evidence)]


def run_task(view: RunView) -> Task:
    """The task of a run; its metadata names the run, its pattern and status."""
    return Task(
        id=view.id,
        context_id=view.context_id,
        status=task_status(view),
        artifacts=task_artifacts(view),
        metadata=_struct(
            {"loopwright": {"run": view.id, "pattern": view.pattern, "status": view.status}}
        ),
    )


# --- pattern → agent card ------------------------------------------------------------------


def _skill_description(pattern: ServedPattern) -> str:
    inputs = ", ".join(pattern.inputs) if pattern.inputs else "none named"
    parts = [pattern.description] if pattern.description else []
    parts.append(f"Goal template:\n{pattern.goal_template}")
    parts.append(
        f"Inputs: {inputs}. Send them as a data part (a JSON object) or as JSON text; plain "
        'text arrives as {"message": <text>}.'
    )
    return "\n\n".join(parts)


def agent_card(pattern: ServedPattern, url: str) -> AgentCard:
    """The pattern's agent card: one skill (its goal and inputs), JSON-RPC at ``url`` (A2A
    1.0, and 0.3 method names on the same URL), streaming, bearer API tokens."""
    example = json.dumps({name: "..." for name in pattern.inputs})
    skill = AgentSkill(
        id=pattern.key,
        name=pattern.title or pattern.key,
        description=_skill_description(pattern),
        tags=["loopwright", "pattern"],
        examples=[example] if pattern.inputs else [],
        input_modes=MEDIA_TYPES,
        output_modes=MEDIA_TYPES,
    )
    scheme = SecurityScheme(
        http_auth_security_scheme=HTTPAuthSecurityScheme(
            scheme="Bearer",
            bearer_format="Loopwright API token",
            description="A Loopwright API token; sending messages needs the operator role.",
        )
    )
    requirement = SecurityRequirement()
    requirement.schemes[SECURITY_SCHEME].CopyFrom(StringList())
    binding = TransportProtocol.JSONRPC.value
    return AgentCard(
        name=pattern.title or pattern.key,
        description=pattern.description or f"The Loopwright pattern {pattern.key!r}.",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding=binding, protocol_version=version)
            for version in (PROTOCOL_VERSION_1_0, PROTOCOL_VERSION_0_3)
        ],
        provider=AgentProvider(organization="Loopwright", url=url),
        version=str(pattern.version),
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        security_schemes={SECURITY_SCHEME: scheme},
        security_requirements=[requirement],
        default_input_modes=MEDIA_TYPES,
        default_output_modes=MEDIA_TYPES,
        skills=[skill],
    )

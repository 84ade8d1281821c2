"""Helpers for the approval tests (docs/reliability.md A1-A4): parked runs, a role-aware scripted
model, an in-process engine driver, a loopback webhook receiver and concurrent deciders.

Two ways to get a run parked on gated calls, both through the real services:

* :func:`park_inline` triggers a run and drives it with the real engine (``drive_run``), the
  real tool loop, the production role policy (``role_tool_policy`` over the run's harness
  snapshot) and the builtin file tools, in this process, with :class:`RoleScript` as the model.
  The maker proposes what the run's ``inputs["rounds"]`` say; gated calls are journaled by the
  loop, the engine parks the run and opens the approvals.
* :func:`park_directly` skips the model: it claims the run, journals one model step and its
  gated calls with the fenced step services and lets the engine's ``_conclude_invocation`` park
  it (hundreds of parked runs in seconds, for the race tests and the authorization sweep).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from unittest import mock

import httpx2
from django.db import DEFAULT_DB_ALIAS, connection, connections

from loops.models import (
    ActionApproval,
    ApprovalStatus,
    LoopEvent,
    LoopPattern,
    LoopRun,
    LoopStep,
    StepStatus,
)
from loops.services.claims import run_claim
from loops.services.patterns import pattern_create
from loops.services.runs import run_trigger
from loops.services.steps import step_begin, step_record
from loops.worker.engine import _conclude_invocation, drive_run, load_run_state
from loops.worker.invoker import AgentInvoker, role_tool_policy
from runtime.invocation import (
    InvocationOutcome,
    InvocationRequest,
    LoopRole,
    NothingToPrepare,
    OutcomeKind,
    StepJournal,
)
from runtime.loop import ToolLoopInvoker
from runtime.tools import (
    DirectoryLedger,
    FileToolConfig,
    ToolContext,
    ToolRegistry,
    ToolResult,
    builtin_file_tools,
)
from runtime.types import ChatRequest, ChatResponse, ToolCall, ToolSpec, Usage
from tests.support.claims import start_claimed
from tests.support.model_server import Completion, RecordedRequest

LEADER, MAKER, VERIFIER = "appr-leader", "appr-maker", "appr-verifier"
PLAN = {"tasks": [{"title": "Carry out the proposed calls"}]}
VERDICT = {"verdict": "pass", "reasons": ["the approvals test script passes"], "checks": []}
_ROLE_TEXT = {
    "leader": "You are the leader of an agent loop",
    "verifier": "You are the independent verifier of an agent loop",
    "maker": "You are a maker in an agent loop",
}
_INPUTS = re.compile(r"Inputs:\n```json\n(.*?)\n```", re.DOTALL)

Call = tuple[str, dict[str, Any]]
"""A tool call the scripted maker proposes: (tool name, arguments)."""


# --- the scripted model --------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    content: str | None
    calls: tuple[Call, ...] = ()


def role_of(messages: Sequence[dict[str, Any]]) -> str:
    system = next((str(m.get("content")) for m in messages if m.get("role") == "system"), "")
    for role, text in _ROLE_TEXT.items():
        if text in system:
            return role
    raise AssertionError(f"no role in the system prompt: {system[:200]!r}")


def inputs_of(messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    first_user = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
    found = _INPUTS.search(first_user)
    return dict(json.loads(found.group(1))) if found else {}


def tool_results(messages: Sequence[dict[str, Any]]) -> list[str]:
    return [str(m.get("content")) for m in messages if m.get("role") == "tool"]


def script_turn(messages: Sequence[dict[str, Any]]) -> Turn:
    """What the scripted model says, a pure function of the conversation.

    The leader plans, the verifier passes; the maker proposes ``inputs["rounds"][n]`` at its
    n-th step (each round a list of ``[tool, arguments]``), then reports every tool result it
    was given, in order.
    """
    role = role_of(messages)
    if role == "leader":
        return Turn(json.dumps(PLAN))
    if role == "verifier":
        return Turn(json.dumps(VERDICT))
    rounds = inputs_of(messages).get("rounds") or []
    made = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
    if made < len(rounds):
        return Turn(None, tuple((str(name), dict(args)) for name, args in rounds[made]))
    return Turn("Finished. Results: " + " | ".join(tool_results(messages)))


class RoleScript:
    """:func:`script_turn` as an in-process ModelClient; keeps every request it answered."""

    def __init__(self) -> None:
        self.requests: list[ChatRequest] = []

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        turn = script_turn(request.messages)
        step = len(self.requests)
        calls = [
            ToolCall(id=f"call_{step}_{i}", name=name, arguments=json.dumps(args))
            for i, (name, args) in enumerate(turn.calls)
        ]
        return ChatResponse(
            content=turn.content or "",
            tool_calls=calls,
            usage=Usage(prompt_tokens=10, completion_tokens=5),
            finish_reason="tool_calls" if calls else "stop",
            model="approvals-script",
        )

    def maker_requests(self) -> list[ChatRequest]:
        return [r for r in self.requests if role_of(r.messages) == "maker"]


def http_reply(request: RecordedRequest) -> Completion:
    """:func:`script_turn` for the loopback model server (``ModelServer.always(http_reply)``)."""
    turn = script_turn(request.body["messages"])
    made = sum(1 for m in request.body["messages"] if m.get("role") == "assistant")
    calls = [
        {
            "id": f"call_{made}_{i}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)},
        }
        for i, (name, args) in enumerate(turn.calls)
    ]
    return Completion(content=turn.content, tool_calls=calls, model="approvals-script")


# --- tools that record what really ran -----------------------------------------------------


@dataclass(frozen=True)
class Executed:
    tool: str
    arguments: dict[str, Any]
    idempotency_key: str
    workdir: str | None


class _Recorded:
    def __init__(self, inner: Any, log: list[Executed]) -> None:
        self.inner, self.log = inner, log

    @property
    def spec(self) -> ToolSpec:
        spec: ToolSpec = self.inner.spec
        return spec

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        record = Executed(self.spec.name, dict(arguments), context.idempotency_key, context.workdir)
        self.log.append(record)
        result: ToolResult = await self.inner.run(arguments, context)
        return result


def recording_registry(ledger_dir: Path) -> tuple[ToolRegistry, list[Executed]]:
    """The builtin file tools (real writes, a real effect ledger), each call recorded."""
    log: list[Executed] = []
    tools = builtin_file_tools(FileToolConfig(ledger=DirectoryLedger(ledger_dir)))
    return ToolRegistry(_Recorded(tool, log) for tool in tools), log


# --- the engine in this process ------------------------------------------------------------


class ScriptedRoleInvoker(NothingToPrepare):
    """The tool loop under the production role policy, with an in-process model."""

    def __init__(self, model: RoleScript, tools: ToolRegistry) -> None:
        self.model, self.tools = model, tools

    async def invoke(
        self, request: InvocationRequest, journal: StepJournal, prepared: Any = None
    ) -> InvocationOutcome:
        policy = role_tool_policy(request, self.tools.specs())
        loop = ToolLoopInvoker(
            model_clients=lambda _username: self.model,
            tools=self.tools,
            policy=lambda _request: policy,
        )
        return await loop.invoke(request, journal)


class InlineDriver:
    """What ``drive_run`` needs of a RunDriver; database calls run inline (same connection, so
    a test's transaction sees them)."""

    def __init__(self, invoker: ScriptedRoleInvoker) -> None:
        self.invoker = invoker

    async def db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)


@dataclass
class Engine:
    """One in-process worker: the scripted model, recording tools, the real engine."""

    ledger_dir: Path
    model: RoleScript = field(default_factory=RoleScript)
    executed: list[Executed] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tools, self.executed = recording_registry(self.ledger_dir)

    def drive(self, run_id: uuid.UUID) -> str:
        """Claim the run and drive it until it finishes or parks; returns its status."""
        claims = run_claim(owner="inline-engine", lease_seconds=300, run_id=run_id)
        assert claims, f"run {run_id} is not claimable: {LoopRun.objects.get(pk=run_id).status}"
        invoker = ScriptedRoleInvoker(self.model, self.tools)
        outer = connections[DEFAULT_DB_ALIAS]

        async def main() -> None:
            # Database handles are per async context: hand the loop this thread's connection,
            # so the engine's writes land in the test's transaction.
            connections[DEFAULT_DB_ALIAS] = outer
            await drive_run(InlineDriver(invoker), claims[0])  # type: ignore[arg-type]

        with mock.patch.dict(os.environ, {"DJANGO_ALLOW_ASYNC_UNSAFE": "true"}):
            asyncio.run(main())
        return str(LoopRun.objects.get(pk=run_id).status)

    def writes_of(self, run_id: uuid.UUID) -> list[Executed]:
        return [e for e in self.executed if e.tool == "write" and str(run_id) in (e.workdir or "")]


def drive_production(run_id: uuid.UUID) -> str:
    """Claim the run and drive it in this process with the production invoker
    (``AgentInvoker``: the employees' models, prompts and tools) until it ends or parks."""
    [claim] = run_claim(owner="production-engine", lease_seconds=300, run_id=run_id)
    driver = InlineDriver(AgentInvoker())  # type: ignore[arg-type]
    outer = connections[DEFAULT_DB_ALIAS]

    async def main() -> None:
        connections[DEFAULT_DB_ALIAS] = outer  # the engine writes on this thread's connection
        await drive_run(driver, claim)  # type: ignore[arg-type]

    with mock.patch.dict(os.environ, {"DJANGO_ALLOW_ASYNC_UNSAFE": "true"}):
        asyncio.run(main())
    return str(LoopRun.objects.get(pk=run_id).status)


# --- patterns and parked runs --------------------------------------------------------------


def approval_pattern(key: str, *, policy: dict[str, Any] | None = None, **fields: Any) -> Any:
    """An L1 pattern without a repository; the maker runs under ``default`` (writes ask)."""
    values: dict[str, Any] = {
        "goal_template": "Approvals test {{ inputs.get('label', '') }}",
        "leader_username": LEADER,
        "maker_usernames": [MAKER],
        "verifier_username": VERIFIER,
        "policy": policy or {},
    }
    values.update(fields)
    return pattern_create(key=key, actor="test", **values)


def write_call(path: str, content: str) -> Call:
    return ("write", {"path": path, "content": content})


def park_inline(
    engine: Engine, pattern: LoopPattern, *rounds: Sequence[Call], label: str = ""
) -> LoopRun:
    """Trigger a run whose maker proposes ``rounds`` and drive it until it parks."""
    inputs = {"label": label, "rounds": [[list(c) for c in r] for r in rounds]}
    run = run_trigger(pattern=pattern, actor="test", inputs=inputs)
    status = engine.drive(run.id)
    assert status == "waiting_approval", f"run {run.id} is {status}, not parked"
    return LoopRun.objects.get(pk=run.id)


def park_directly(
    pattern: LoopPattern,
    calls: Sequence[Call],
    *,
    role: LoopRole = LoopRole.MAKER,
    employee: str = MAKER,
    reason: str = "the tool plan asks for approval of this tool",
) -> LoopRun:
    """A run parked on ``calls`` through the real services, without a model: claim, a model
    step and one gated step per call (fenced journal writes), then the engine's conclusion."""
    run = run_trigger(pattern=pattern, actor="test", inputs={"label": "direct"})
    [claim] = run_claim(owner="test-parker", lease_seconds=300, run_id=run.id)
    lease = claim.lease
    start_claimed(claim, event_type="run.started")
    invocation = "maker:0" if role == LoopRole.MAKER else role.value
    wire = [
        {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, (n, a) in enumerate(calls)
    ]
    model_seq = step_record(
        lease,
        role=role.value,
        invocation=invocation,
        kind="model",
        name="approvals-script",
        request={"step": 1, "phase": "normal", "tools": sorted({n for n, _ in calls})},
        response={"message": {"role": "assistant", "content": None, "tool_calls": wire}},
    )
    gated = []
    for index, (name, arguments) in enumerate(calls):
        seq = step_begin(
            lease,
            role=role.value,
            invocation=invocation,
            kind="tool",
            name=name,
            request={
                "model_seq": model_seq,
                "index": index,
                "call_id": f"call_{index}",
                "arguments": arguments,
                "disposition": "gate",
                "gate_reason": reason,
            },
            idempotency_key=f"{run.id}:{model_seq}:{index}",
            status=StepStatus.GATED,
        )
        gated.append({"seq": seq, "tool": name, "arguments": arguments, "reason": reason})
    outcome = InvocationOutcome(kind=OutcomeKind.NEEDS_APPROVAL, output={"gated": gated})
    _conclude_invocation(lease, load_run_state(run.id), outcome, (role, invocation, employee))
    return LoopRun.objects.get(pk=run.id)


def pending_approvals(run: LoopRun) -> list[ActionApproval]:
    return list(
        ActionApproval.objects.filter(run=run, status=ApprovalStatus.PENDING).order_by("step_seq")
    )


def response_text(step: LoopStep) -> str:
    """What the model is given for a finished tool step."""
    response = step.response if isinstance(step.response, dict) else {}
    return str(response.get("content", ""))


def event_types(run_id: uuid.UUID) -> list[str]:
    return list(
        LoopEvent.objects.filter(run_id=run_id).order_by("seq").values_list("type", flat=True)
    )


# --- the audit (A2) ------------------------------------------------------------------------


def audit_problems() -> list[str]:
    """Every way the approvals table disagrees with what ran: an executed hash that differs
    from the approved one, an executed hash on a call that was not approved, an approved call
    that completed without an executed hash or under a key not naming its approval, or a
    gated step without an approval. (An approved call the executor refused is ``failed``
    without an executed hash: not a problem.)"""
    problems = []
    for approval in ActionApproval.objects.all():
        step = LoopStep.objects.get(run_id=approval.run_id, seq=approval.step_seq)
        ran = approval.status == ApprovalStatus.APPROVED and step.status == "completed"
        if approval.executed_hash and approval.status != ApprovalStatus.APPROVED:
            problems.append(f"{approval.id}: executed hash on a {approval.status} approval")
        if approval.executed_hash and approval.executed_hash != approval.approved_hash:
            problems.append(f"{approval.id}: executed {approval.executed_hash[:12]} != approved")
        if ran and not approval.executed_hash:
            problems.append(f"{approval.id}: ran without an executed hash")
        if ran and f":approval:{approval.id}" not in step.idempotency_key:
            problems.append(f"{approval.id}: key {step.idempotency_key!r} lacks the approval id")
    for step in LoopStep.objects.filter(status__in=[StepStatus.GATED, StepStatus.APPROVED]):
        if not ActionApproval.objects.filter(run_id=step.run_id, step_seq=step.seq).exists():
            problems.append(f"step {step.run_id}#{step.seq} is {step.status} without an approval")
    return problems


# --- a loopback webhook receiver -----------------------------------------------------------


class _WebhookHandler(BaseHTTPRequestHandler):
    server: _WebhookServer

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            self.server.received.append(
                {"path": self.path, "headers": dict(self.headers), "json": json.loads(raw)}
            )
        self.send_response(204)
        self.end_headers()


class _WebhookServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _WebhookHandler)
        self.received: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hooks/approvals"


@contextmanager
def webhook_receiver() -> Iterator[_WebhookServer]:
    """A real HTTP server on 127.0.0.1 recording every POST; ``server.url`` to configure."""
    server = _WebhookServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# --- concurrent deciders -------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    decision: str
    status: int
    body: dict[str, Any]
    sent_at: float
    answered_at: float


def fire_together(work: Sequence[Callable[[], Any]], timeout: float = 180) -> list[Any]:
    """Run every callable in its own thread, released together; exceptions are returned."""
    barrier = threading.Barrier(len(work))
    results: list[Any] = [None] * len(work)

    def run(index: int) -> None:
        try:
            barrier.wait(timeout=timeout)
            results[index] = work[index]()
        except Exception as exc:  # the assertions look at every outcome
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(work))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a decider thread hung"
    return results


def http_decide(client: httpx2.Client, approval_id: Any, decision: str, **body: Any) -> Decision:
    """POST /api/v1/approvals/<id>/decide over real HTTP."""
    sent = time.monotonic()
    response = client.post(
        f"/api/v1/approvals/{approval_id}/decide", json={"decision": decision, **body}
    )
    answered = time.monotonic()
    payload = response.json() if response.content else {}
    return Decision(decision, response.status_code, payload, sent, answered)


def http_client(base_url: str, token: str, timeout: float = 120) -> httpx2.Client:
    return httpx2.Client(
        base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout
    )


def race_decisions(
    base_url: str, token: str, approval_ids: Sequence[Any], batch: int = 5
) -> dict[Any, list[Decision]]:
    """Approve, approve and reject each approval at the same instant, each request on its own
    HTTP connection; ``batch`` approvals at a time (the test server's listen backlog is small,
    so more simultaneous connections would be reset before reaching the application)."""
    outcomes: dict[Any, list[Decision]] = {}
    clients = [http_client(base_url, token) for _ in range(3 * batch)]
    try:
        for start in range(0, len(approval_ids), batch):
            chunk = approval_ids[start : start + batch]
            work = [
                functools.partial(http_decide, clients[3 * i + k], approval_id, decision)
                for i, approval_id in enumerate(chunk)
                for k, decision in enumerate(("approve", "approve", "reject"))
            ]
            results = fire_together(work)
            for i, approval_id in enumerate(chunk):
                outcomes[approval_id] = results[3 * i : 3 * i + 3]
    finally:
        for client in clients:
            client.close()
    return outcomes


def loopback_team(base_url: str, name: str) -> None:
    """The approvals team (leader reads, maker reads and writes, verifier reads) on one
    OpenAI-compatible endpoint at ``base_url`` (a ``ModelServer`` of the test)."""
    from orchestrator.agents.services import employee_create, model_endpoint_create

    endpoint = model_endpoint_create(
        name=f"{name}-loopback",
        provider="openai",
        base_url=base_url,
        model=f"{name}-script",
        max_retries=1,
        timeout_seconds=60,
    )
    tools = {LEADER: ["read", "list"], MAKER: ["read", "list", "write", "edit"]}
    for username in (LEADER, MAKER, VERIFIER):
        employee_create(
            username=username, endpoint=endpoint, tools=tools.get(username, ["read", "list"])
        )

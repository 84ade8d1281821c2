"""Helpers for the limits tests (budgets, breakers, tool loops): runs holding a lease, and the
real engine driven in this process by a role-aware scripted model that can loop forever.

The in-process engine is the production ``drive_run`` with the real tool loop and the fenced
journal; only the model (a function of the conversation) and the tools (recording ones) are
test doubles, so every budget and tool-loop check runs exactly as in a worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from django.db import DEFAULT_DB_ALIAS, connections

from loops.models import LoopPattern, LoopRun
from loops.policy import PatternPolicy
from loops.services.claims import run_claim
from loops.services.transitions import Lease
from loops.worker.engine import drive_run
from runtime.invocation import (
    InvocationOutcome,
    InvocationRequest,
    NothingToPrepare,
    StepJournal,
)
from runtime.loop import LoopSettings, ToolLoopInvoker
from runtime.policy import ToolPolicy
from runtime.tools import ToolRegistry
from runtime.types import ChatRequest, ChatResponse, ToolCall, Usage
from tests.support.claims import start_claimed
from tests.support.factories import make_pattern, make_run
from tests.support.fake_model import RecordingTool

PLAN = {"tasks": [{"title": "probe until told to stop"}]}
PASS = {"verdict": "pass", "reasons": ["scripted"], "checks": []}
_ROLES = {
    "leader": "You are the leader of an agent loop",
    "verifier": "You are the independent verifier of an agent loop",
    "maker": "You are a maker in an agent loop",
}


def snapshot(policy: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run's ``policy_snapshot`` as run_trigger pins it (validated, defaults filled in)."""
    return PatternPolicy.model_validate(policy or {}).model_dump(mode="json")


def running_run(
    pattern: LoopPattern | None = None, *, policy: dict[str, Any] | None = None, owner: str = "t"
) -> tuple[LoopRun, Lease]:
    """A run of ``pattern`` claimed by ``owner`` and running; ``policy`` is what it pinned
    (defaults to the pattern's policy)."""
    pattern = pattern or make_pattern()
    run = make_run(pattern, policy_snapshot=snapshot(policy or pattern.policy))
    [claim] = run_claim(owner=owner, lease_seconds=300, run_id=run.id)
    start_claimed(claim, event_type="t")
    return LoopRun.objects.get(pk=run.id), claim.lease


def queued_run(pattern: LoopPattern | None = None) -> LoopRun:
    """A queued run of ``pattern`` that pinned the pattern's policy, as run_trigger does."""
    pattern = pattern or make_pattern()
    return make_run(pattern, policy_snapshot=snapshot(pattern.policy))


def tool_request(arguments: Any, model_seq: int = 1, index: int = 0) -> dict[str, Any]:
    """A tool step's request as the runtime journals it."""
    return {"model_seq": model_seq, "index": index, "call_id": "c", "arguments": arguments}


# --- the scripted model --------------------------------------------------------------------


def role_of(messages: Sequence[dict[str, Any]]) -> str:
    system = next((str(m.get("content")) for m in messages if m.get("role") == "system"), "")
    return next(role for role, text in _ROLES.items() if text in system)


MakerTurn = Callable[[Sequence[dict[str, Any]]], list[tuple[str, dict[str, Any]]] | None]
"""The maker's next tool calls as a function of its conversation; None: it answers."""


def probe_forever(messages: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """A maker that never stops: one new call per step, alternating tools and arguments so the
    runtime's own repetition guard never ends the invocation."""
    made = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
    return [("probe" if made % 2 else "peek", {"n": made})]


@dataclass
class LoopingModel:
    """The leader plans, the verifier passes, the maker does ``maker_turn`` until ``stop`` is
    set. Every call is charged ``usage`` tokens (prompt, completion) and ``cost``."""

    maker_turn: MakerTurn = probe_forever
    usage: tuple[int, int] = (400, 100)
    cost: float = 0.025
    stop: threading.Event = field(default_factory=threading.Event)
    requests: list[ChatRequest] = field(default_factory=list)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        role = role_of(request.messages)
        calls = None if role != "maker" or self.stop.is_set() else self.maker_turn(request.messages)
        if role == "leader":
            content = json.dumps(PLAN)
        elif role == "verifier":
            content = json.dumps(PASS)
        else:
            content = "" if calls else "Done probing."
        step = len(self.requests)
        tool_calls = [
            ToolCall(id=f"call_{step}_{i}", name=name, arguments=json.dumps(args))
            for i, (name, args) in enumerate(calls or [])
        ]
        return ChatResponse(
            content=content,
            tool_calls=tool_calls,
            usage=Usage(prompt_tokens=self.usage[0], completion_tokens=self.usage[1]),
            finish_reason="tool_calls" if tool_calls else "stop",
            model="limits-script",
            cost=self.cost,
        )

    def calls_by(self, role: str) -> int:
        return sum(1 for r in self.requests if role_of(r.messages) == role)


# --- the engine in this process ------------------------------------------------------------


class _Invoker(NothingToPrepare):
    def __init__(self, model: LoopingModel, tools: ToolRegistry, max_steps: int) -> None:
        self.model, self.tools, self.max_steps = model, tools, max_steps

    async def invoke(
        self, request: InvocationRequest, journal: StepJournal, prepared: Any = None
    ) -> InvocationOutcome:
        policy = ToolPolicy.from_decisions({name: "allow" for name in self.tools.names()})
        loop = ToolLoopInvoker(
            model_clients=lambda _username: self.model,
            tools=self.tools,
            policy=lambda _request: policy,
            settings=LoopSettings(max_steps=self.max_steps),
        )
        return await loop.invoke(request, journal)


class InlineDriver:
    """What ``drive_run`` needs of a RunDriver, with database calls on the test's connection."""

    def __init__(self, invoker: Any) -> None:
        self.invoker = invoker

    async def db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)


@dataclass
class InlineEngine:
    """The real engine with the scripted model and two recording tools, ``peek`` and
    ``probe``; ``max_steps`` is the maker's step cap (high: the budgets must stop it)."""

    model: LoopingModel = field(default_factory=LoopingModel)
    max_steps: int = 200
    peek: RecordingTool = field(default_factory=lambda: RecordingTool("peek"))
    probe: RecordingTool = field(default_factory=lambda: RecordingTool("probe"))

    @property
    def executed(self) -> int:
        return len(self.peek.calls) + len(self.probe.calls)

    def drive(self, run_id: uuid.UUID) -> str:
        """Claim the run and drive it until it finishes or parks; returns its status."""
        claims = run_claim(owner="inline", lease_seconds=300, run_id=run_id)
        assert claims, f"run {run_id} is not claimable: {LoopRun.objects.get(pk=run_id).status}"
        invoker = _Invoker(self.model, ToolRegistry([self.peek, self.probe]), self.max_steps)
        outer = connections[DEFAULT_DB_ALIAS]

        async def main() -> None:
            # Database handles are per async context: hand the loop this thread's connection,
            # so the engine's writes land in the test's transaction.
            connections[DEFAULT_DB_ALIAS] = outer
            await drive_run(InlineDriver(invoker), claims[0])  # type: ignore[arg-type]

        with mock.patch.dict(os.environ, {"DJANGO_ALLOW_ASYNC_UNSAFE": "true"}):
            asyncio.run(main())
        return str(LoopRun.objects.get(pk=run_id).status)

"""The real engine in this process against the loopback model server, for the model-wait tests.

``HttpEngine`` is the production ``drive_run`` with the real tool loop, the fenced journal and
the production HTTP model client (``OpenAICompatibleClient``, its endpoint breaker over the
database store), talking to a :class:`~tests.support.model_server.ModelServer`. Only the tools
are left out: the roles answer in text and JSON. :func:`role_reply` answers each role as the
loop expects (the leader's plan, the maker's text, the verifier's pass).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from unittest import mock

from django.db import DEFAULT_DB_ALIAS, connections
from django.utils import timezone

from loops.models import LoopRun, RunStatus
from loops.services.claims import run_claim
from loops.worker.engine import drive_run
from orchestrator.agents.breaker_store import DatabaseBreakerStore
from runtime.breaker import CircuitBreaker
from runtime.invocation import InvocationOutcome, InvocationRequest, NothingToPrepare, StepJournal
from runtime.loop import LoopSettings, ToolLoopInvoker
from runtime.model_client import OpenAICompatibleClient
from runtime.model_config import EndpointConfig, RetryPolicy
from runtime.policy import ToolPolicy
from runtime.tools import ToolRegistry
from tests.support.limits import PASS, PLAN, InlineDriver, role_of
from tests.support.model_server import Completion, ModelServer, RecordedRequest

T = TypeVar("T")
FAST = RetryPolicy(base_delay=0.01, max_delay=0.02, max_retry_after=1)
TERMINAL = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELED}


def role_reply(request: RecordedRequest) -> Completion:
    """What each role answers: the leader a plan, the verifier a pass, the maker text."""
    role = role_of(request.body["messages"])
    if role == "leader":
        return Completion(content=json.dumps(PLAN))
    if role == "verifier":
        return Completion(content=json.dumps(PASS))
    return Completion(content="Done.")


async def _inline(fn: Callable[[], T]) -> T:
    """The breaker store's calls on the test's own thread and connection (as the driver's)."""
    return fn()


class _Invoker(NothingToPrepare):
    def __init__(self, engine: HttpEngine) -> None:
        self.engine = engine

    async def invoke(
        self, request: InvocationRequest, journal: StepJournal, prepared: Any = None
    ) -> InvocationOutcome:
        engine = self.engine
        client = OpenAICompatibleClient(engine.config, breaker=engine.breaker, retry=FAST)
        loop = ToolLoopInvoker(
            model_clients=lambda _username: client,
            tools=ToolRegistry([]),
            policy=lambda _request: ToolPolicy.from_decisions({}),
            settings=LoopSettings(max_steps=4, context_window_tokens=engine.config.context_window),
        )
        return await loop.invoke(request, journal)


@dataclass
class HttpEngine:
    """The real engine, model calls over HTTP to ``server`` as endpoint ``name``."""

    server: ModelServer
    name: str = "waits-loopback"
    timeout_seconds: float = 2.0
    cooldown_seconds: float = 1.0
    context_window: int = 128_000
    #: Drives of the engine (claims that found the run due).
    drives: int = 0
    breaker: CircuitBreaker = field(init=False)
    config: EndpointConfig = field(init=False)

    def __post_init__(self) -> None:
        self.breaker = CircuitBreaker(DatabaseBreakerStore(offload=_inline))
        self.config = EndpointConfig(
            name=f"{self.name}-{uuid.uuid4().hex[:6]}",
            base_url=self.server.url,
            model="waits-model",
            max_retries=0,
            timeout_seconds=self.timeout_seconds,
            circuit_cooldown_seconds=self.cooldown_seconds,
            context_window=self.context_window,
        )

    def drive(self, run_id: uuid.UUID) -> bool:
        """Claim the run and drive it until it finishes or parks; False when it was not due."""
        claims = run_claim(owner="inline-http", lease_seconds=300, run_id=run_id)
        if not claims:
            return False
        self.drives += 1
        outer = connections[DEFAULT_DB_ALIAS]

        async def main() -> None:
            connections[DEFAULT_DB_ALIAS] = outer
            await drive_run(InlineDriver(_Invoker(self)), claims[0])  # type: ignore[arg-type]

        with mock.patch.dict(os.environ, {"DJANGO_ALLOW_ASYNC_UNSAFE": "true"}):
            asyncio.run(main())
        return True

    def settle(self, run_id: uuid.UUID, *, within: float, skip_waits: bool = False) -> LoopRun:
        """Drive the run whenever it is due until it ends (``skip_waits``: without waiting for
        its ``not_before``); fails the test after ``within`` seconds."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            run = LoopRun.objects.get(pk=run_id)
            if run.status in TERMINAL:
                return run
            if skip_waits and run.not_before is not None:
                LoopRun.objects.filter(pk=run_id).update(not_before=timezone.now())
            if not self.drive(run_id):
                time.sleep(0.05)
        raise AssertionError(f"run {run_id} did not end within {within} s: {run.status}")

"""SQL statements per tool-loop step, counted so that they cannot creep up unnoticed.

A real leased run, the engine's own journal (``DbJournal``: fenced step writes, budgets, tool
limits) and the real tool loop, with an instant in-process model that calls a no-op tool once
per step. The journal's database calls run inline on this thread (the driver sends them to its
thread pool; the statements are the same), so ``CaptureQueriesContext`` sees all of them. A step
is everything between two model calls: persisting the model step, beginning the tool call,
running it, persisting its result. Transaction control (BEGIN, COMMIT, savepoints) is not
counted as a statement; the number of database calls (each one transaction or one read) is
counted separately.

The ceilings are today's figures. Lower them when the engine gets leaner; never raise them
without a measured reason (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from loops import db
from loops.policy import PatternPolicy
from loops.services import budget_rules
from loops.services.claims import run_claim
from loops.worker.engine import DbJournal, _invocation_begin, load_run_state, prepare
from runtime.invocation import InvocationRequest, LoopRole
from runtime.loop import LoopSettings, ToolLoopInvoker
from runtime.policy import ToolPolicy
from runtime.tools import ToolRegistry, ToolResult
from runtime.types import ChatResponse, Effect, ToolCall, ToolSpec, Usage
from tests.support.factories import make_pattern, make_run

# Real transactions (the journal commits each write); the seeded harness profiles come back
# through ``seeded_profiles`` (tests/conftest.py) after each flush.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("seeded_profiles")]

#: Statements between two model calls of a steady-state step (model step + one tool call),
#: by vendor and the tool's effect. A read runs first and is written once, finished, with the
#: model step that made it; a write is begun with the model step and completed (fence, step).
#: PostgreSQL: the fence that also proves the limits and the duplicate-call count unchanged
#: since the journal last read them, the two steps, their usage. SQLite (statement by
#: statement, no round trips to save): fence + limits, the count, the two steps, their usage.
STATEMENTS_PER_STEP = {
    "postgresql": {Effect.READ: 4, Effect.WRITE: 6},
    "sqlite": {Effect.READ: 5, Effect.WRITE: 7},
}
#: Calls of the journal into the database per step (each one transaction).
DB_CALLS_PER_STEP = {Effect.READ: 1, Effect.WRITE: 2}
#: Network round trips per step on PostgreSQL (a transaction's statements are sent together,
#: its commit with them).
ROUND_TRIPS_PER_STEP = {Effect.READ: 1, Effect.WRITE: 2}
STEPS = 12
TOOLS = ("noop_a", "noop_b")  # alternated: the repetition guard ends long runs of one tool


class NoopTool:
    def __init__(self, name: str, effect: Effect) -> None:
        self.spec = ToolSpec(
            name=name,
            description="does nothing",
            parameters={"type": "object", "properties": {"i": {"type": "integer"}}},
            effect=effect,
        )

    async def run(self, arguments: dict[str, Any], context: Any) -> ToolResult:
        return ToolResult("ok")


class InlineDriver:
    """The driver's ``db`` hop without the thread pool: each call runs here, its statements
    captured on the connection it actually uses (an event loop's code may get its own)."""

    def __init__(self) -> None:
        self.calls = 0
        self.statements: list[str] = []

    async def db(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        with CaptureQueriesContext(connection) as queries:
            try:
                return fn(*args, **kwargs)
            finally:
                self.statements.extend(_statements(queries.captured_queries))


class CountingModel:
    """Answers at once; notes the statement, db-call and round-trip counts at every model
    call."""

    def __init__(self, driver: InlineDriver) -> None:
        self.driver = driver
        self.marks: list[tuple[int, int, int]] = []

    async def complete(self, request: Any, **_: Any) -> ChatResponse:
        self.marks.append((len(self.driver.statements), self.driver.calls, db.round_trips()))
        made = len(self.marks) - 1
        if made < STEPS:
            name = TOOLS[made % len(TOOLS)]
            call = ToolCall(id=f"call_{made}", name=name, arguments=json.dumps({"i": made}))
            return ChatResponse(content="", tool_calls=[call], usage=Usage(10, 5))
        return ChatResponse(content="done", usage=Usage(10, 5))


def _statements(queries: list[dict[str, Any]]) -> list[str]:
    control = ("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT", "BEGIN", "COMMIT")
    return [q["sql"] for q in queries if not q["sql"].lstrip().upper().startswith(control)]


def _leased_run() -> tuple[Any, Any]:
    policy = PatternPolicy().model_dump(mode="json")
    run = make_run(make_pattern(), policy_snapshot=policy)
    [claim] = run_claim(owner="perf-test", lease_seconds=60, run_id=run.id)
    state = load_run_state(run.id)
    assert prepare(claim.lease, state, 2.0) == "running"
    return claim.lease, state


async def _invoke_and_close(invoker: ToolLoopInvoker, request: Any, journal: Any) -> Any:
    # Connect in this coroutine, so the tool calls' tasks share its connection (Django keeps
    # connections per async context; a task that connected first would keep its own).
    connection.ensure_connection()
    try:
        return await invoker.invoke(request, journal)
    finally:
        connection.close()  # the event loop's own connection, or the test database stays busy


def _per_step(
    monkeypatch: pytest.MonkeyPatch, effect: Effect
) -> list[tuple[int, int, int, list[str]]]:
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # the journal runs inline here
    # An unmetered run re-asks for admission once a second; a slow machine must not see it.
    monkeypatch.setattr(budget_rules, "ADMISSION_RECHECK_SECONDS", 3600.0)
    lease, state = _leased_run()
    driver = InlineDriver()
    start, calls = _invocation_begin(lease, LoopRole.MAKER, "maker:0")
    journal = DbJournal(driver, lease, LoopRole.MAKER, "maker:0")  # type: ignore[arg-type]
    journal.started(
        fresh=start.started,
        metered=start.metered,
        steps=start.steps,
        limits=start.limits,
        calls=calls,
    )
    request = InvocationRequest(
        run_id=state.id,
        role=LoopRole.MAKER,
        invocation="maker:0",
        employee_username="maker",
        goal="count statements",
        harness={},
        workdir=state.cursor.get("workdir"),
    )
    model = CountingModel(driver)
    invoker = ToolLoopInvoker(
        model_clients=lambda _username: model,
        tools=ToolRegistry([NoopTool(name, effect) for name in TOOLS]),
        policy=lambda _request: ToolPolicy.from_decisions({n: "allow" for n in TOOLS}),
        settings=LoopSettings(max_steps=STEPS + 2),
    )
    started = time.monotonic()
    outcome = asyncio.run(_invoke_and_close(invoker, request, journal))
    assert time.monotonic() - started < 60
    assert outcome.kind == "completed", outcome
    steps = []
    for (q0, c0, r0), (q1, c1, r1) in zip(model.marks, model.marks[1:], strict=False):
        steps.append((q1 - q0, c1 - c0, r1 - r0, driver.statements[q0:q1]))
    return steps


@pytest.mark.parametrize("effect", [Effect.READ, Effect.WRITE])
def test_a_tool_loop_step_issues_at_most_the_counted_sql_statements(
    monkeypatch: pytest.MonkeyPatch, effect: Effect
) -> None:
    steps = _per_step(monkeypatch, effect)
    assert len(steps) == STEPS
    steady = steps[1:]  # the first step also creates the run's usage rows
    worst = max(steady, key=lambda s: s[0])
    listing = "\n".join(worst[3])
    ceiling = STATEMENTS_PER_STEP[connection.vendor][effect]
    assert worst[0] <= ceiling, (
        f"a step now issues {worst[0]} SQL statements (ceiling {ceiling}) "
        f"on {connection.vendor}:\n{listing}"
    )
    assert max(s[1] for s in steady) <= DB_CALLS_PER_STEP[effect]
    if connection.vendor == "postgresql":
        assert max(s[2] for s in steady) <= ROUND_TRIPS_PER_STEP[effect]


@pytest.mark.parametrize("effect", [Effect.READ, Effect.WRITE])
def test_the_statements_per_step_do_not_grow_with_the_history(
    monkeypatch: pytest.MonkeyPatch, effect: Effect
) -> None:
    steps = _per_step(monkeypatch, effect)
    counts = [s[0] for s in steps[1:]]
    assert max(counts) == min(counts), f"statements per step vary with history: {counts}"

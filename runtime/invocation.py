"""The seam between the run engine and whatever carries out a role invocation.

The engine decides *which* invocation comes next (leader, each maker, verifier) and owns the
run's state; an invoker carries one invocation out and persists every step through the
:class:`StepJournal` the engine hands it. The journal's writes are fenced by the run's lease, so
an invoker whose worker lost the lease cannot write (it gets :class:`LeaseLost`).

Every method the engine calls on an invoker or the invoker calls on a journal is declared on
:class:`RoleInvoker` and :class:`StepJournal`. The tool loop (``runtime.loop``) is a
:class:`RoleInvoker`; until one is configured, :class:`UnavailableInvoker` fails runs with a
clear reason: nothing pretends to be an agent.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Protocol, TypeVar

T = TypeVar("T")


class LeaseLost(Exception):
    """The worker no longer holds the run's lease: stop at once and write nothing more."""


class RetryLater(Exception):
    """A temporary failure (every model endpoint down, rate limited): the engine parks the run
    in ``queued`` with a delay instead of failing it. Nothing of the failed step is persisted."""

    def __init__(self, reason: str, delay_seconds: float = 30.0) -> None:
        super().__init__(reason)
        self.delay_seconds = delay_seconds


class LoopRole(enum.StrEnum):
    LEADER = "leader"
    MAKER = "maker"
    VERIFIER = "verifier"


@dataclass(frozen=True)
class InvocationRequest:
    run_id: uuid.UUID
    role: LoopRole
    #: Stable name of this invocation within the run, e.g. ``leader``, ``maker:0``, ``verifier``.
    invocation: str
    employee_username: str
    goal: str
    #: The compiled harness snapshot of this role (immutable for the run).
    harness: dict[str, Any]
    #: What earlier invocations produced: ``{"plan": ..., "maker_outputs": [...]}``.
    context: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    workdir: str | None = None
    #: A request-scoped invocation (``runtime.chat``): the client's chat messages (OpenAI wire
    #: shape), sent after the system prompt instead of the goal message. None: a run's role.
    conversation: tuple[dict[str, Any], ...] | None = None
    #: OpenAI function tools the *client* runs: offered next to the server tools; a step that
    #: calls one ends the invocation with the calls (``output["client_tool_calls"]``).
    client_tools: tuple[dict[str, Any], ...] = ()
    #: The person the work is for: the run's ``triggered_by`` (a username, or ``scheduler``),
    #: the chat endpoint's caller; "" when nobody is known. Memory's ``user`` scopes key on it.
    user: str = ""
    #: The prompt blocks of the apps (``runtime.prompt_context``), when the caller read them
    #: already (a chat, with its preparation); None: the employee's prompt asks for them.
    prompt_blocks: tuple[str, ...] | None = None
    #: The employee's bound tool names, as the caller read them with its (current) profile, for
    #: the prompt blocks; None: a provider that needs them reads them.
    employee_tools: tuple[str, ...] | None = None
    #: ``{name: version}`` of the instructions the run pinned (``${instructions.name}`` in a
    #: prompt renders that version); {}: the latest published (a chat).
    instructions: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StepRecord:
    """A persisted step as the journal returns it (for resume)."""

    seq: int
    kind: str  # "model" | "tool" | "notice"
    status: str  # "started" | "completed" | "failed" | "gated" | "approved"
    name: str
    idempotency_key: str
    request: dict[str, Any]
    response: Any
    error: str


class OutcomeKind(enum.StrEnum):
    COMPLETED = "completed"
    NEEDS_APPROVAL = "needs_approval"
    FAILED = "failed"
    BLOCKED = "blocked"
    ESCALATE = "escalate"


class RunHalted(Exception):
    """A run-level limit stops the run: the journal raises it instead of starting the next model
    call, tool call or invocation, and persists nothing of what it refused.

    Invokers must let it propagate untouched, like :class:`LeaseLost`; the engine turns it into
    the run's next state (``outcome``: BLOCKED parks the run in ``blocked``, ESCALATE sends it to
    ``waiting_human``, FAILED ends it) with ``code`` as the run's ``terminal_reason``,
    ``reason`` as its ``failure_reason`` and ``data`` in the event.
    """

    outcome: ClassVar[OutcomeKind]

    def __init__(self, reason: str, *, code: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason, self.code, self.data = reason, code, dict(data or {})


class BudgetExhausted(RunHalted):
    """A per-run or daily budget has no room for what was about to start (the run blocks)."""

    outcome = OutcomeKind.BLOCKED


class HarnessLimitReached(RunHalted):
    """A limit of the role's compiled harness (``limits.*``, ``isolation.*``) stops the run: it
    ends ``failed`` with ``code`` ``harness_limit:<setting>``, and ``reason`` names the value and
    the layer that set it. Unlike a budget, no raise can lift it."""

    outcome = OutcomeKind.FAILED


class ToolLoopEscalated(RunHalted):
    """The run repeated one tool call (same name and arguments) ``toolLoop.escalateAt`` times:
    a human takes over (the run goes to ``waiting_human``)."""

    outcome = OutcomeKind.ESCALATE


def ask_refusal(question: str) -> str:
    """What the model reads for a call that needs a person's answer where none can be asked."""
    return (
        f"Error: the call needs an answer from a person ({question}); nobody can be asked "
        "here, so it was left unanswered. Ask the user, then call again with what they said."
    )


class ToolCallRefused(Exception):
    """The journal refused to start a tool call (the run's tool-loop policy blocks it).

    The call is already persisted as a finished step whose result is ``content``: the invoker
    must not run the tool and gives the model ``content`` as the call's result.
    """

    def __init__(self, content: str, *, seq: int) -> None:
        super().__init__(content)
        self.content, self.seq = content, seq


@dataclass(frozen=True)
class RecordedCall:
    """What :meth:`StepJournal.record_call` made of a read-effect call that already ran."""

    seq: int
    #: False: the journal only began the call's step (the run adds a notice to its result, as
    #: for a begun call): the caller completes it, with :meth:`StepJournal.tool_notice`.
    completed: bool = True


@dataclass(frozen=True)
class InvocationOutcome:
    kind: OutcomeKind
    #: For COMPLETED: the invocation's output (a plan, a maker summary, a verdict).
    output: dict[str, Any] = field(default_factory=dict)
    #: For FAILED / BLOCKED / ESCALATE: a human-readable reason; ``code`` is machine-readable.
    reason: str = ""
    code: str = ""


#: Where a resume starts: a conversation checkpoint's JSON (``runtime.checkpoint``) and the
#: steps after it, or None and every step.
ResumePoint = tuple[str | None, list[StepRecord]]


class StepJournal(Protocol):
    """Durable, fenced persistence for one invocation's steps (provided by the engine)."""

    async def steps(self) -> list[StepRecord]:
        """Steps of this invocation persisted so far, in order (empty on a fresh start)."""
        ...

    async def resume_point(self) -> tuple[str | None, list[StepRecord]]:
        """Where a resume starts: the invocation's latest conversation checkpoint (the JSON
        :meth:`save_checkpoint` kept) and the steps after it, in order; ``(None, steps())``
        when it has none (and on a fresh start, ``(None, [])``)."""
        ...

    async def save_checkpoint(self, upto_seq: int, state: str) -> None:
        """Keep ``state`` (``runtime.checkpoint``: the fold of the steps ``seq <= upto_seq``) as
        the invocation's latest checkpoint. Best effort: a journal may keep none, and a resume
        without one replays every step."""
        ...

    async def begin(
        self, *, kind: str, name: str, request: dict[str, Any], idempotency_key: str = ""
    ) -> int:
        """Persist a step as started before its side effect happens; returns its seq."""
        ...

    async def complete(
        self,
        seq: int,
        *,
        response: Any,
        error: str = "",
        tokens_in: int = 0,
        tokens_out: int = 0,
        cost: float = 0.0,
    ) -> None:
        """Persist the step's result (status completed, or failed when ``error`` is set)."""
        ...

    async def record(
        self,
        *,
        kind: str,
        name: str,
        request: dict[str, Any],
        response: Any,
        error: str = "",
        tokens_in: int = 0,
        tokens_out: int = 0,
        cost: float = 0.0,
        duration_ms: int | None = None,
    ) -> int:
        """Persist a step that has already finished (a model call, a read) in one write."""
        ...

    def runs_first(self, name: str, request: dict[str, Any]) -> bool:
        """May this read-effect call run before anything of it is persisted, and be written
        once, finished (:meth:`record_call`)? False when the run's limits must judge it before
        it runs (it then goes through :meth:`begin` and :meth:`complete`)."""
        ...

    async def record_call(
        self,
        *,
        name: str,
        request: dict[str, Any],
        idempotency_key: str,
        response: Any,
        error: str = "",
        started_at: datetime | None = None,
    ) -> RecordedCall:
        """Persist a read-effect tool call that has already run (from ``started_at``), with its
        result, in one write.

        A call that changes nothing needs no durable start: after a crash it simply runs again.
        The run's limits apply as for :meth:`begin` (raising ``ToolCallRefused`` or
        ``RunHalted``; the result of a refused call is then discarded).
        """
        ...

    async def gate(
        self, *, name: str, request: dict[str, Any], idempotency_key: str, reason: str
    ) -> int:
        """Persist a tool call that policy gates (status ``gated``); it must not run yet.

        The invoker then returns ``NEEDS_APPROVAL``; the engine parks the run. When a human
        decides, the step becomes ``approved`` (``request`` holds the approved arguments) or
        ``completed`` with the rejection as its response, and the invocation is resumed.
        """
        ...

    async def ask(self, seq: int, *, question: str) -> None:
        """The tool call of step ``seq`` (``started`` or ``approved``) needs a person's answer
        (``ToolResult.input_request``): the step becomes ``gated`` with ``question`` and waits like
        a gated call. When the question is answered the step is ``approved`` again and its
        ``request["answer"]`` holds the answer; a refusal completes it.

        Raises :class:`ToolCallRefused` where no person can be asked (its content is the
        result the model reads; the step is then completed with it)."""
        ...

    async def event(self, type: str, data: dict[str, Any]) -> None:
        """Append an event to the run's history (tool warnings, compaction notices, ...)."""
        ...

    def idempotency_key(self, step_seq: int, call_index: int = 0) -> str:
        """``<run id>:<step seq>:<call index>``: what every side-effecting tool receives."""
        ...

    async def admit_model_call(self) -> None:
        """Wait until the run's limits let the next model call start (called right before it).

        Raises :class:`RunHalted` (a spent tokens or cost budget) when it may not start at all;
        may wait while another run's call on a shared budget is in flight near its limit.
        """
        ...

    async def authorize(self, seq: int, name: str, arguments: dict[str, Any]) -> str:
        """Check an approved call (step ``seq``, status ``approved``) right before it runs:
        ``name`` and ``arguments`` must be exactly what the human approved for this run, step
        and policy version (docs/reliability.md A2). Returns "" when it may run, else why not; a
        refused call must not run (the invoker completes its step with the refusal as an
        error)."""
        ...

    def tool_notice(self, seq: int) -> str:
        """A notice the run's policy attached to tool step ``seq`` when it began (a run-level
        tool-loop warning), or the review of the approval it runs under (given with
        :meth:`authorize`), to show the model with the call's result; "" for none.

        ``begin`` and ``gate`` of a tool step may also raise :class:`ToolCallRefused` (the call
        must not run) or :class:`RunHalted` (the run stops); ``record`` may raise
        :class:`RunHalted`.
        """
        ...

    async def db_call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on a thread that may use the database (the engine's pooled
        connections), for an invoker's own blocking reads; never on the event loop."""
        ...


class RoleInvoker(Protocol):
    """Carries out invocations.

    The engine first starts ``prepare`` (what the invoker reads before it can start: an
    employee's profile, say) while it begins the invocation, then passes its result to
    ``invoke`` as ``prepared``. An invoker with nothing to read returns None
    (:class:`NothingToPrepare`)."""

    async def prepare(self, request: InvocationRequest, journal: StepJournal) -> Any:
        """What ``invoke`` needs read first; None when nothing."""
        ...

    async def invoke(
        self, request: InvocationRequest, journal: StepJournal, prepared: Any = None
    ) -> InvocationOutcome:
        """Carry out one invocation. Let LeaseLost and RunHalted through (ToolCallRefused is the
        journal's answer to one call, not the invocation's); never swallow cancellation."""
        ...


class NothingToPrepare:
    """The ``prepare`` of an invoker that reads nothing before it starts."""

    async def prepare(self, request: InvocationRequest, journal: StepJournal) -> None:
        return None


class UnavailableInvoker(NothingToPrepare):
    """The default until an agent runtime is configured: fails the run and says why."""

    async def invoke(
        self, request: InvocationRequest, journal: StepJournal, prepared: Any = None
    ) -> InvocationOutcome:
        return InvocationOutcome(
            kind=OutcomeKind.FAILED,
            code="no_agent_runtime",
            reason=(
                "No agent runtime is configured (LOOPWRIGHT_INVOKER), so no role can be invoked."
            ),
        )

"""What a tool is to the loop: a spec, an async ``run``, a context, a result."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from runtime.types import ToolSpec

if TYPE_CHECKING:
    from runtime.invocation import InvocationRequest

#: What an approval appends to a call's idempotency key (``<key>:approval:<id>``).
APPROVAL_KEY_MARK = ":approval:"


def call_key(idempotency_key: str) -> str:
    """``idempotency_key`` without the approvals appended to it."""
    return idempotency_key.split(APPROVAL_KEY_MARK, 1)[0]


class ToolError(Exception):
    """An expected failure; its message goes to the model as the tool result, so make it
    actionable (what was wrong and what to do instead)."""


@dataclass(frozen=True)
class ToolResult:
    content: str
    is_error: bool = False
    #: Workdir-relative paths this call wrote; the loop persists them so ``maxFiles`` holds
    #: across a resume.
    files_written: tuple[str, ...] = ()
    #: A question only a person can answer (a remote agent's ``input-required``): the call is
    #: not finished; its step waits in the approvals inbox, and the call runs again with the
    #: answer in :attr:`ToolContext.answer` (``content`` is what the model reads where no one
    #: can be asked).
    input_request: str = ""
    #: Images of the result as ``data:image/<type>;base64,`` URLs (an MCP tool's image blocks):
    #: shown to a model whose endpoint accepts images; the loop bounds them (count, size) and
    #: notes in the text what it drops. ``content`` should make sense without them.
    images: tuple[str, ...] = ()


@dataclass(frozen=True)
class Invocation:
    """Who makes a tool call: the run invocation it belongs to, as plain data.

    The loop that builds a call's :class:`ToolContext` sets it from the invocation it carries
    out, so a tool authorises and attributes its call from this, never by finding a row (which
    may not be written yet when the call runs)."""

    run_id: uuid.UUID
    #: ``leader``, ``maker`` or ``verifier``.
    role: str
    #: The invocation's name within the run: ``leader``, ``maker:0``, ``verifier``.
    name: str
    #: The AI employee playing the role (its username).
    employee: str
    #: The compiled harness settings of the role's snapshot (fixed for the run); ``None`` when
    #: the run has no snapshot for the role, which denies whatever the harness must allow.
    harness: Mapping[str, Any] | None = None
    #: The snapshot's ``provenance``: compiled field path (``paths.deny``) -> the layer that
    #: decided it (``profile:x@1``), named in refusals.
    harness_provenance: Mapping[str, str] | None = None
    #: The tools the employee binds (its ``tools`` list, as read when the invocation began).
    bound_tools: frozenset[str] = frozenset()
    #: The run pattern's ``approvals.autoAllowlist``: tools whose ``ask`` is waived.
    auto_allowlist: frozenset[str] = frozenset()
    #: The person the work is for (``InvocationRequest.user``); "" when nobody is known.
    user: str = ""
    #: The instruction versions the run pinned (``InvocationRequest.instructions``).
    instructions: Mapping[str, int] = field(default_factory=dict)
    #: The key of the run's pattern ("" outside runs): model alias rules match on it.
    pattern: str = ""

    @classmethod
    def of_request(
        cls, request: InvocationRequest, bound_tools: Collection[str] = ()
    ) -> Invocation:
        """What a tool call of ``request`` carries: the run, role, employee, the role's harness
        settings, the pattern's key and autoAllowlist, all from the request itself."""
        return cls(
            run_id=request.run_id,
            role=str(request.role),
            name=request.invocation,
            employee=request.employee_username,
            harness=(request.harness or {}).get("settings"),
            harness_provenance=(request.harness or {}).get("provenance"),
            bound_tools=frozenset(bound_tools),
            auto_allowlist=frozenset(request.context.get("auto_allowlist") or ()),
            user=request.user,
            instructions=request.instructions,
            pattern=str(request.context.get("pattern") or ""),
        )


@dataclass
class ToolContext:
    """Everything a tool call may rely on besides its arguments."""

    workdir: str | None
    #: ``<run id>:<step seq>:<call index>``; the same on a re-issue after a crash, so a
    #: side-effecting tool can make its effect happen once.
    idempotency_key: str
    #: ``time.monotonic()`` value after which the loop abandons the call as timed out.
    deadline: float
    call_id: str = ""
    #: True when the call was started before (a crash or lost lease) and is issued again.
    reissued: bool = False
    #: Distinct workdir-relative files written in this invocation (shared by its calls).
    files_written: set[str] = field(default_factory=set)
    #: Set when the call is cancelled or times out; work running in a thread polls it.
    cancelled: threading.Event = field(default_factory=threading.Event)
    #: Who makes the call; ``None`` outside a run (a tool that needs a caller refuses then).
    invocation: Invocation | None = None
    #: A person's answer to the question this call asked (``ToolResult.input_request``), when
    #: it runs again after that answer; "" otherwise.
    answer: str = ""

    @property
    def call_key(self) -> str:
        """The idempotency key of the call itself, the same across its approvals and answers
        (each approval extends :attr:`idempotency_key` with ``:approval:<id>``)."""
        return call_key(self.idempotency_key)

    def remaining(self) -> float:
        return max(self.deadline - time.monotonic(), 0.0)

    def check(self) -> None:
        """Raise when the call should stop (cancelled, or past its deadline)."""
        if self.cancelled.is_set() or self.remaining() <= 0:
            raise ToolError("The tool call was cancelled or ran out of time.")


class Tool(Protocol):
    @property
    def spec(self) -> ToolSpec: ...

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        """Do the work. Raise :class:`ToolError` for expected failures."""
        ...

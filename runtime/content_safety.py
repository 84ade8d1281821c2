"""Content safety on every model call of a run (docs/guardrails.md, "Content safety in runs"):
the pattern's ``policy.contentSafety`` (the shape of an employee's guardrails) checks what each
model call of an invocation sends and what it answers.

Invariants:

- The input rules see each user and tool message once per invocation (by digest of role and
  content), before the call that first sends it: the goal, each tool result, a compaction
  summary; never the whole history again. The output rules see the answer's text and its tool
  calls' arguments before the loop acts on them.
- A blocking decision (a match, or an error under ``failMode: closed``) records a
  ``content_safety.blocked`` run event and raises :class:`ContentSafetyBlocked`: the run ends
  ``failed`` with ``terminal_reason`` ``content_safety:<rule>``. A blocked answer's usage is
  recorded as a model step with an error (never replayed) and without its text. An error let
  through (``failMode: open``) records ``content_safety.error`` and the call goes on. Recorded
  reasons are the guardrails' masked ones: the checked text is never copied.
- Sub-agents inherit the parent's rules (:func:`inherited`): the client of a child dispatched
  inside a guarded invocation is guarded too, and a child's block stops the run at the parent's
  next model call.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runtime.guardrails import (
    GuardrailConfig,
    GuardrailDecision,
    GuardrailReport,
    check_input,
    check_output,
    parse_guardrail_config,
)
from runtime.invocation import OutcomeKind, RunHalted, StepJournal
from runtime.tools.scope import InvocationScope, current_scope
from runtime.types import ChatRequest, ChatResponse, Message, ModelClient

__all__ = [
    "CODE",
    "ContentSafetyBlocked",
    "ContentSafetyClient",
    "guarded",
    "inherited",
]

#: The ``terminal_reason`` of a blocked run is ``content_safety:<rule>``.
CODE = "content_safety"
#: The roles whose messages the input rules check (the system prompt and presets are the
#: operator's; the assistant's messages were checked as output).
INPUT_ROLES = frozenset({"user", "tool"})
_STATE_KEY = "content_safety"
_STAGE_WORDS = {"input": "what the model call would send", "output": "the model's answer"}


class ContentSafetyBlocked(RunHalted):
    """A content-safety rule blocked a model call's input or output: the run ends ``failed``."""

    outcome = OutcomeKind.FAILED


@dataclass
class SafetyLedger:
    """The rules of one guarded invocation tree and its first block (shared with sub-agents)."""

    config: GuardrailConfig
    blocked: ContentSafetyBlocked | None = None


@dataclass
class ContentSafetyClient:
    """``inner`` with the input rules before and the output rules after each call."""

    inner: ModelClient
    ledger: SafetyLedger
    #: Who makes the calls (an invocation name; a sub-agent's employee), for the events.
    label: str = ""
    #: Where decisions are recorded when no invocation scope is current.
    journal: StepJournal | None = None
    checked: set[str] = field(default_factory=set)
    calls: int = 0

    @property
    def config(self) -> GuardrailConfig:
        return self.ledger.config

    async def complete(self, request: ChatRequest) -> ChatResponse:
        scope = current_scope()
        if scope is not None:  # the tools of this invocation (sub-agents) inherit the rules
            scope.state.setdefault(_STATE_KEY, self.ledger)
        if self.ledger.blocked is not None:  # a sub-agent's block stops its parent too
            raise self.ledger.blocked
        self.calls += 1
        if self.config.input:
            fresh = self._unchecked(request.messages)
            if fresh:
                report = await check_input(self.config, fresh.values())
                await self._judge(report, scope)
                self.checked.update(fresh)
        response = await self.inner.complete(request)
        if self.config.output:
            report = await check_output(self.config, answer_text(response))
            await self._judge(report, scope, response)
        return response

    def _unchecked(self, messages: Iterable[Message]) -> dict[str, Message]:
        fresh: dict[str, Message] = {}
        for message in messages:
            if message.get("role") not in INPUT_ROLES:
                continue
            key = _digest(message)
            if key not in self.checked:
                fresh[key] = message
        return fresh

    async def _judge(
        self,
        report: GuardrailReport,
        scope: InvocationScope | None,
        response: ChatResponse | None = None,
    ) -> None:
        """Record the report's blocking and failed decisions; raise on a block."""
        noted = [d.as_dict() for d in report.decisions if d.verdict != "allow"]
        if not noted:
            return
        journal = scope.journal if scope is not None else self.journal
        blocked = report.blocked
        data: dict[str, Any] = {
            "stage": report.stage,
            "invocation": self.label,
            "model_call": self.calls,
            "blocked_by": blocked.rule if blocked is not None else None,
            "decisions": noted,
        }
        if journal is not None:
            kind = "blocked" if blocked is not None else "error"
            await journal.event(f"{CODE}.{kind}", data)
        if blocked is None:
            return
        halt = ContentSafetyBlocked(
            _reason(blocked), code=f"{CODE}:{blocked.rule}", data={"content_safety": data}
        )
        self.ledger.blocked = halt
        if response is not None and journal is not None:
            await _record_withheld(journal, response, halt)
        raise halt


def _reason(decision: GuardrailDecision) -> str:
    return (
        f"Content safety rule {decision.rule!r} ({decision.kind}) blocked "
        f"{_STAGE_WORDS[decision.stage]} ({decision.stage} stage): {decision.reason}"
    )


async def _record_withheld(
    journal: StepJournal, response: ChatResponse, halt: ContentSafetyBlocked
) -> None:
    """The blocked answer's usage, as a model step with an error and without its text."""
    await journal.record(
        kind="model",
        name=response.model or "model",
        request={CODE: "output"},
        response={"finish_reason": "content_filter", "model": response.model, **halt.data},
        error=halt.reason,
        tokens_in=response.usage.prompt_tokens,
        tokens_out=response.usage.completion_tokens,
        cost=response.cost,
    )


def _digest(message: Message) -> str:
    content = json.dumps(message.get("content"), sort_keys=True, default=str)
    return hashlib.sha256(f"{message.get('role')}\0{content}".encode()).hexdigest()


def answer_text(response: ChatResponse) -> str:
    """What the output rules check: the answer's text, then each tool call's arguments."""
    parts = [response.content, *(call.arguments for call in response.tool_calls)]
    return "\n\n".join(part for part in parts if part)


def guarded(
    client: ModelClient,
    config: Mapping[str, Any] | None,
    *,
    label: str = "",
    journal: StepJournal | None = None,
) -> ModelClient:
    """``client`` under ``config`` (the stored ``contentSafety``); itself when there are no
    rules."""
    if not config:
        return client
    parsed = parse_guardrail_config(dict(config))
    if parsed.empty:
        return client
    return ContentSafetyClient(client, SafetyLedger(parsed), label=label, journal=journal)


def inherited(client: ModelClient, parent: InvocationScope | None, label: str = "") -> ModelClient:
    """A sub-agent's ``client`` under the rules of the guarded invocation that dispatches it
    (``parent``: its scope); itself when that invocation is not guarded."""
    ledger = parent.state.get(_STATE_KEY) if parent is not None else None
    if not isinstance(ledger, SafetyLedger):
        return client
    return ContentSafetyClient(client, ledger, label=label)

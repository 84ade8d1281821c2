"""Guardrails: checks on what a client sends to an employee and on what the employee answers
(docs/guardrails.md).

- :func:`check_input` checks the user-visible text of the client's OpenAI messages before the
  tool loop runs; :func:`check_output` checks a whole answer; :class:`StreamGate` gates a
  streamed answer, holding back a window of text so that a match spanning chunks is caught
  before any of it is released.
- Every rule gives a :class:`GuardrailDecision` (allow, block, or an error that lets the text
  through or blocks it, by the rule's ``failMode``); a :class:`GuardrailReport` holds them and
  names the first blocking one. Built-in rules run first, in order, and stop at the first
  block; then the moderation rules run, concurrently.

No Django: the gateway stores the configuration (:class:`GuardrailConfig`) per employee,
records the decisions (:meth:`GuardrailDecision.as_dict`) and turns a block into its answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx2

from runtime.guardrails_config import (
    BlocklistRule,
    GuardrailConfig,
    GuardrailConfigInvalid,
    MaxCharsRule,
    ModerationRule,
    PiiRule,
    RegexRule,
    Rule,
    RuleKind,
    SecretsRule,
    guardrail_problems,
    parse_guardrail_config,
)
from runtime.guardrails_moderation import ModerationUnavailable, moderate
from runtime.guardrails_patterns import Finding, find_blocklist, find_pii, find_regex, find_secret
from runtime.outbound import OutboundPolicy

__all__ = [
    "GuardrailConfig",
    "GuardrailConfigInvalid",
    "GuardrailDecision",
    "GuardrailReport",
    "StreamGate",
    "check_input",
    "check_output",
    "guardrail_problems",
    "message_text",
    "parse_guardrail_config",
]

Stage = Literal["input", "output"]
Verdict = Literal["allow", "block", "error_open", "error_closed"]
#: Released text kept as context for the next window scan, at least (matches that began in it
#: are still found, though part of them is out).
CONTEXT_CHARS = 256
#: A stream's text is scanned and released in steps of up to this many characters past the
#: window (a quarter of the window when that is less), not on every delta.
RELEASE_STEP_CHARS = 64
#: Joins the texts of the messages (and of their parts) into the one text the input rules see.
MESSAGE_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class GuardrailDecision:
    """One rule's verdict on one text. ``reason`` says what matched (masked) or what failed."""

    stage: Stage
    rule: str
    kind: RuleKind
    verdict: Verdict
    reason: str
    duration_ms: float

    @property
    def blocks(self) -> bool:
        return self.verdict in ("block", "error_closed")

    def as_dict(self) -> dict[str, Any]:
        """The recorded form (JSON-ready)."""
        return {
            "stage": self.stage,
            "rule": self.rule,
            "kind": self.kind,
            "verdict": self.verdict,
            "reason": self.reason,
            "duration_ms": round(self.duration_ms, 3),
        }


@dataclass(frozen=True)
class GuardrailReport:
    """The decisions of one stage, in the order the rules ran."""

    stage: Stage
    decisions: tuple[GuardrailDecision, ...] = ()

    @property
    def blocked(self) -> GuardrailDecision | None:
        """The first blocking decision, or None when the text may pass."""
        return next((d for d in self.decisions if d.blocks), None)

    def as_dict(self) -> dict[str, Any]:
        blocked = self.blocked
        return {
            "stage": self.stage,
            "blocked": blocked is not None,
            "blocked_by": blocked.rule if blocked is not None else None,
            "decisions": [d.as_dict() for d in self.decisions],
        }


def message_text(messages: Iterable[Mapping[str, Any]]) -> str:
    """The user-visible text of OpenAI messages: string contents and ``text`` parts, every
    role, joined by :data:`MESSAGE_SEPARATOR` (images and other parts are not text)."""
    pieces: list[str] = []
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str):
            pieces.append(content)
        elif isinstance(content, list):
            pieces.extend(
                part["text"]
                for part in content
                if isinstance(part, Mapping)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            )
    return MESSAGE_SEPARATOR.join(p for p in pieces if p)


def _finding(rule: Rule, text: str, size: int) -> tuple[bool, str]:
    """(whether a built-in ``rule`` blocks ``text``, the reason); ``size`` is the length of the
    whole text (a stream's window is shorter than what it belongs to)."""
    found: Finding | None
    if isinstance(rule, MaxCharsRule):
        if size > rule.max_chars:
            return True, f"{size} characters, more than the {rule.max_chars} allowed"
        return False, f"{size} of {rule.max_chars} characters"
    if isinstance(rule, BlocklistRule):
        found = find_blocklist(tuple(rule.words), text)
    elif isinstance(rule, RegexRule):
        found = find_regex(rule.pattern, rule.ignore_case, text)
    elif isinstance(rule, PiiRule):
        found = find_pii(rule.types, text)
    elif isinstance(rule, SecretsRule):
        found = find_secret(rule.types, text)
    else:
        raise TypeError(f"{rule.kind} is not a built-in rule")
    if found is None:
        return False, "no match"
    return True, f"contains {found.describe()}"


def _error(stage: Stage, rule: Rule, problem: str, started: float) -> GuardrailDecision:
    verdict: Verdict = "error_closed" if rule.fail_mode == "closed" else "error_open"
    shown = "blocked" if verdict == "error_closed" else "let through"
    return GuardrailDecision(
        stage, rule.name, rule.kind, verdict, f"check failed, {shown} (failMode {rule.fail_mode}): "
        f"{problem}", _ms(started),
    )  # fmt: skip


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def _local(stage: Stage, rule: Rule, text: str, size: int | None = None) -> GuardrailDecision:
    started = time.perf_counter()
    try:
        blocks, reason = _finding(rule, text, len(text) if size is None else size)
    except Exception as exc:  # a check that breaks obeys failMode like any other failure
        return _error(stage, rule, f"{type(exc).__name__}: {exc}", started)
    verdict: Verdict = "block" if blocks else "allow"
    return GuardrailDecision(stage, rule.name, rule.kind, verdict, reason, _ms(started))


async def _remote(
    stage: Stage, rule: ModerationRule, text: str, options: _Options
) -> GuardrailDecision:
    started = time.perf_counter()
    try:
        answer = await moderate(
            rule, text, http=options.http, policy=options.policy, environ=options.environ
        )
    except ModerationUnavailable as exc:
        return _error(stage, rule, str(exc), started)
    blocks, reason = answer.blocks(rule)
    verdict: Verdict = "block" if blocks else "allow"
    return GuardrailDecision(stage, rule.name, rule.kind, verdict, reason, _ms(started))


@dataclass(frozen=True)
class _Options:
    http: httpx2.AsyncClient | None = None
    policy: OutboundPolicy | None = None
    environ: Mapping[str, str] | None = None


async def _check(
    stage: Stage, rules: Iterable[Rule], text: str, options: _Options
) -> GuardrailReport:
    decisions: list[GuardrailDecision] = []
    remote: list[ModerationRule] = []
    for rule in rules:
        if isinstance(rule, ModerationRule):
            remote.append(rule)
            continue
        decisions.append(_local(stage, rule, text))
        if decisions[-1].blocks:
            return GuardrailReport(stage, tuple(decisions))
    if remote:
        decisions.extend(await asyncio.gather(*(_remote(stage, r, text, options) for r in remote)))
    return GuardrailReport(stage, tuple(decisions))


async def check_input(
    config: GuardrailConfig,
    messages: Iterable[Mapping[str, Any]],
    *,
    http: httpx2.AsyncClient | None = None,
    policy: OutboundPolicy | None = None,
    environ: Mapping[str, str] | None = None,
) -> GuardrailReport:
    """The input rules over the user-visible text of ``messages`` (:func:`message_text`).
    ``http`` / ``policy`` / ``environ``: see :func:`runtime.guardrails_moderation.moderate`."""
    return await _check(
        "input", config.input, message_text(messages), _Options(http, policy, environ)
    )


async def check_output(
    config: GuardrailConfig,
    text: str,
    *,
    http: httpx2.AsyncClient | None = None,
    policy: OutboundPolicy | None = None,
    environ: Mapping[str, str] | None = None,
) -> GuardrailReport:
    """The output rules over a whole answer."""
    return await _check("output", config.output, text, _Options(http, policy, environ))


class StreamGate:
    """The output rules over a streamed answer, released as it becomes safe.

    :meth:`feed` takes each content delta and returns the text that may go to the client now:
    everything but the last ``streamWindowChars`` characters, after the built-in rules passed
    over the held text plus the last window already released (scanned and released in steps of
    :data:`RELEASE_STEP_CHARS` at most, never unscanned). A match of at most
    ``streamWindowChars`` characters is therefore caught before any of it is released; a
    longer one may be partly out already. :meth:`finish` runs every output rule (moderation
    included) over the whole answer and returns the held rest if it passes. Once a rule
    blocks, :attr:`blocked` is its decision and nothing more is released: the caller ends the
    stream with ``finish_reason: "content_filter"``. With ``streamRelease: "end"`` nothing is
    released before :meth:`finish`; with no output rules, deltas pass straight through.
    """

    def __init__(
        self,
        config: GuardrailConfig,
        *,
        http: httpx2.AsyncClient | None = None,
        policy: OutboundPolicy | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self._options = _Options(http, policy, environ)
        self._local = [r for r in config.output if not isinstance(r, ModerationRule)]
        # Only a length limit needs no window: its verdict does not depend on what follows.
        needs_window = any(not isinstance(r, MaxCharsRule) for r in config.output)
        self._window = config.stream_window_chars if needs_window else 0
        self._context = max(self._window, CONTEXT_CHARS) if needs_window else 0
        # Scan (and release) once this much text is past the window, not on every small delta.
        self._step = max(1, min(RELEASE_STEP_CHARS, self._window // 4))
        self._limit = min(
            (r.max_chars for r in config.output if isinstance(r, MaxCharsRule)), default=None
        )
        self._hold_all = bool(config.output) and config.stream_release == "end"
        self._parts: list[str] = []
        self._size = 0
        self._pending = ""  # received, not released
        self._tail = ""  # the last window of released text: context for matches across it
        self._spent: dict[str, float] = {}
        self._decisions: list[GuardrailDecision] = []
        self.released_chars = 0
        self.blocked: GuardrailDecision | None = None
        self.finished = False

    @property
    def text(self) -> str:
        """Everything fed so far (released or not)."""
        return "".join(self._parts)

    @property
    def held_chars(self) -> int:
        return len(self._pending)

    @property
    def report(self) -> GuardrailReport:
        """The decisions so far: the blocking one, or after :meth:`finish` one per rule run."""
        return GuardrailReport("output", tuple(self._decisions))

    def feed(self, delta: str) -> str:
        """The text of the answer that may be released now ("" while held or once blocked)."""
        if self.finished:
            raise RuntimeError("StreamGate.feed after finish")
        if self.blocked is not None or not delta:
            return ""
        self._parts.append(delta)
        self._size += len(delta)
        if not self.config.output:
            self.released_chars += len(delta)
            return delta
        self._pending += delta
        if self._hold_all:
            # Nothing is released before finish(): scan now and then only to stop early.
            if len(self._pending) >= (self._context or CONTEXT_CHARS) and self._check_window(
                self._tail + self._pending
            ):
                self._tail = (self._tail + self._pending)[-self._context :] if self._context else ""
                self._pending = ""
            return ""
        cut = len(self._pending) - self._window
        if cut < self._step and not self._size_passed():
            return ""  # nothing worth releasing yet: scan later, before anything goes out
        if not self._check_window(self._tail + self._pending):
            return ""
        out, self._pending = self._pending[:cut], self._pending[cut:]
        self._tail = (self._tail + out)[-self._context :] if self._context else ""
        self.released_chars += len(out)
        return out

    async def finish(self) -> str:
        """The held rest of the answer if the whole answer passes every output rule, else ""
        (and :attr:`blocked` set). Call once, after the last :meth:`feed`."""
        if self.finished:
            raise RuntimeError("StreamGate.finish called twice")
        self.finished = True
        if self.blocked is not None:
            return ""
        report = await _check("output", self.config.output, self.text, self._options)
        self._decisions = [
            dataclasses.replace(d, duration_ms=d.duration_ms + self._spent.get(d.rule, 0.0))
            for d in report.decisions
        ]
        blocked = next((d for d in self._decisions if d.blocks), None)
        if blocked is not None:
            self._stop(blocked, record=False)
            return ""
        out, self._pending = (self.text if self._hold_all else self._pending), ""
        self.released_chars += len(out)
        return out

    def _size_passed(self) -> bool:
        return self._limit is not None and self._size > self._limit

    def _check_window(self, scan: str) -> bool:
        """Run the built-in rules over ``scan``; False (and blocked) when one blocks."""
        for rule in self._local:
            decision = _local("output", rule, scan, self._size)
            self._spent[rule.name] = self._spent.get(rule.name, 0.0) + decision.duration_ms
            if decision.blocks:
                self._stop(decision)
                return False
        return True

    def _stop(self, decision: GuardrailDecision, *, record: bool = True) -> None:
        self.blocked = decision
        self._pending = ""
        if record:
            self._decisions = [decision]

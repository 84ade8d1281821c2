"""Known secrets out of everything an invocation persists (docs/reliability.md P2).

The model client keeps API keys out of its own errors and logs (``secrets.redact``). What it
cannot stop is the *content* of a step carrying a key: a hostile or confused provider echoing
the credential in its answer, a model putting it in tool arguments, a tool's error message
quoting those arguments, an output (plan, verdict) built from them. Steps, events and outcomes
are stored, shown by the API and replayed into later prompts, so the invoker wraps the journal
in :class:`ScrubbingJournal`, which masks every known secret value in whatever is persisted,
and scrubs the invocation's outcome the same way.

The role's ``observability.redact`` patterns (regular expressions) mask what they match in the
same places, so a secret-shaped value that no configuration knows (a token the model or a tool
came across) is kept out of the run's record of prompts and responses too.

Masking happens before anything is written, so a masked value is gone for good: a gated call
approved later, or a call re-issued after a crash, runs with the mask in place of the secret.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar, cast

from runtime.invocation import InvocationOutcome, RecordedCall, StepJournal, StepRecord
from runtime.secrets import MASK, Secret

T = TypeVar("T")

#: Shorter values are not masked: a one-letter "key" would mask every such letter of a step.
MIN_SECRET_CHARS = 8


def secret_values(secrets: Sequence[Secret | None]) -> tuple[str, ...]:
    """The revealed values worth masking, longest first (a key containing another)."""
    values = {s.reveal() for s in secrets if s is not None and len(s.reveal()) >= MIN_SECRET_CHARS}
    return tuple(sorted(values, key=len, reverse=True))


def redact_patterns(settings: Any) -> tuple[re.Pattern[str], ...]:
    """The compiled ``observability.redact`` patterns of a role's harness settings (they were
    validated when compiled; one that no longer compiles is skipped)."""
    section = (settings or {}).get("observability") or {}
    found = []
    for text in section.get("redact") or ():
        try:
            found.append(re.compile(str(text)))
        except re.error:
            continue
    return tuple(found)


def scrub(value: T, secrets: Sequence[str], patterns: Sequence[re.Pattern[str]] = ()) -> T:
    """``value`` (JSON-like: dicts, lists, strings, numbers) with every secret, and every match
    of ``patterns``, masked."""
    if not secrets and not patterns:
        return value
    return cast(T, _scrub(value, secrets, patterns))


def _scrub(value: Any, secrets: Sequence[str], patterns: Sequence[re.Pattern[str]]) -> Any:
    if isinstance(value, str):
        for secret in secrets:
            if secret in value:
                value = value.replace(secret, MASK)
        for pattern in patterns:
            value = pattern.sub(MASK, value)
        return value
    if isinstance(value, dict):
        return {
            _scrub(k, secrets, patterns): _scrub(v, secrets, patterns) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(_scrub(v, secrets, patterns) for v in value)
    return value


def scrub_outcome(
    outcome: InvocationOutcome,
    secrets: Sequence[str],
    patterns: Sequence[re.Pattern[str]] = (),
) -> InvocationOutcome:
    if not secrets and not patterns:
        return outcome
    return replace(
        outcome,
        output=scrub(outcome.output, secrets, patterns),
        reason=scrub(outcome.reason, secrets, patterns),
    )


class ScrubbingJournal:
    """A :class:`~.invocation.StepJournal` that masks ``secrets`` and the matches of
    ``patterns`` in what it persists."""

    def __init__(
        self,
        inner: StepJournal,
        secrets: Sequence[str],
        patterns: Sequence[re.Pattern[str]] = (),
    ) -> None:
        self.inner = inner
        self.secrets = tuple(secrets)
        self.patterns = tuple(patterns)

    def _s(self, value: T) -> T:
        return scrub(value, self.secrets, self.patterns)

    async def steps(self) -> list[StepRecord]:
        return await self.inner.steps()

    async def resume_point(self) -> tuple[str | None, list[StepRecord]]:
        return await self.inner.resume_point()

    async def save_checkpoint(self, upto_seq: int, state: str) -> None:
        # Folded from the persisted (masked) steps; masked again all the same.
        await self.inner.save_checkpoint(upto_seq, self._s(state))

    async def begin(
        self, *, kind: str, name: str, request: dict[str, Any], idempotency_key: str = ""
    ) -> int:
        return await self.inner.begin(
            kind=kind, name=name, request=self._s(request), idempotency_key=idempotency_key
        )

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
        await self.inner.complete(
            seq,
            response=self._s(response),
            error=self._s(error),
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost=cost,
        )

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
        return await self.inner.record(
            kind=kind,
            name=name,
            request=self._s(request),
            response=self._s(response),
            error=self._s(error),
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost=cost,
            duration_ms=duration_ms,
        )

    def runs_first(self, name: str, request: dict[str, Any]) -> bool:
        return self.inner.runs_first(name, self._s(request))

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
        return await self.inner.record_call(
            name=name,
            request=self._s(request),
            idempotency_key=idempotency_key,
            response=self._s(response),
            error=self._s(error),
            started_at=started_at,
        )

    async def ask(self, seq: int, *, question: str) -> None:
        await self.inner.ask(seq, question=self._s(question))

    async def gate(
        self, *, name: str, request: dict[str, Any], idempotency_key: str, reason: str
    ) -> int:
        return await self.inner.gate(
            name=name,
            request=self._s(request),
            idempotency_key=idempotency_key,
            reason=self._s(reason),
        )

    async def event(self, type: str, data: dict[str, Any]) -> None:
        await self.inner.event(type, self._s(data))

    def idempotency_key(self, step_seq: int, call_index: int = 0) -> str:
        return self.inner.idempotency_key(step_seq, call_index)

    async def admit_model_call(self) -> None:
        await self.inner.admit_model_call()

    async def authorize(self, seq: int, name: str, arguments: dict[str, Any]) -> str:
        # The approved arguments were stored masked: compare like with like.
        return await self.inner.authorize(seq, name, self._s(arguments))

    def tool_notice(self, seq: int) -> str:
        return self.inner.tool_notice(seq)

    async def db_call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self.inner.db_call(fn, *args, **kwargs)

"""Context compaction (pure): make a message list fit a token budget, keeping what matters.

Tokens are *estimated* at 4 characters per token plus a small overhead per message. That is
deliberately rough: no tokenizer is exact for every model behind an OpenAI-compatible endpoint,
and the loop has a second line of defence (a provider's context-overflow error forces a harder
compaction and one re-issue of the step).

What is kept, in order of priority: the head (system prompt and goal), the most recent groups,
then older groups. A *group* is a message and the tool results that answer it, so an assistant
message with ``tool_calls`` is never separated from its tool messages (providers reject such a
history). Reductions, cheapest loss first:

1. prune the output of old tool results (the call stays, its output becomes a short note);
2. drop the oldest groups whole, leaving one note that says how many messages went;
3. shorten the tool outputs of the recent groups to an equal share of what is left.

:func:`judge_overflow` weighs a provider's context-overflow answer against the request's
estimated size and the context window, so an answer that cannot be true is not taken for one.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from runtime.tool_images import image_count, is_images_message
from runtime.truncation import truncate_output
from runtime.types import Message

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4
#: Tool outputs shorter than this are not worth pruning.
PRUNE_MIN_CHARS = 400
#: Recent groups are never dropped (normal compaction) ...
KEEP_RECENT_GROUPS = 4
#: ... and a forced compaction after a context overflow keeps only the last one.
FORCED_KEEP_RECENT_GROUPS = 1
MIN_SHORTENED_CHARS = 200
#: Upper bound on the length of the note ``truncate_output`` appends.
NOTE_ALLOWANCE_CHARS = 160
#: What an ``image_url`` part counts for, whatever its URL's length: providers bill an image by
#: its pixels (about a thousand tokens for a large one), not by its base64 text.
IMAGE_TOKENS = 1_000


@dataclass(frozen=True)
class Compaction:
    messages: list[Message]
    tokens_before: int
    tokens_after: int
    pruned_outputs: int = 0
    dropped_messages: int = 0
    shortened_outputs: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.pruned_outputs or self.dropped_messages or self.shortened_outputs)

    def summary(self) -> dict[str, int]:
        return {
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "pruned_outputs": self.pruned_outputs,
            "dropped_messages": self.dropped_messages,
            "shortened_outputs": self.shortened_outputs,
        }


def _chars(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value)
    return len(json.dumps(value, ensure_ascii=False))


def message_tokens(message: Message) -> int:
    content = message.get("content")
    images = image_count(message)
    if images and isinstance(content, list):
        content = [p for p in content if not (isinstance(p, dict) and p.get("type") == "image_url")]
    chars = _chars(content) + _chars(message.get("tool_calls"))
    return math.ceil(chars / CHARS_PER_TOKEN) + MESSAGE_OVERHEAD_TOKENS + images * IMAGE_TOKENS


def estimate_tokens(messages: list[Message], tools: list[dict[str, Any]] | None = None) -> int:
    """Estimated prompt tokens of a request: its messages plus its tool schemas."""
    schema_tokens = math.ceil(_chars(tools) / CHARS_PER_TOKEN) if tools else 0
    return sum(message_tokens(m) for m in messages) + schema_tokens


def group_messages(messages: list[Message]) -> list[list[Message]]:
    """Split into groups: each non-tool message starts one; tool results (and the message
    carrying their images) join the current."""
    groups: list[list[Message]] = []
    for message in messages:
        if (message.get("role") == "tool" or is_images_message(message)) and groups:
            groups[-1].append(message)
        else:
            groups.append([message])
    return groups


def _pruned(message: Message) -> Message:
    size = _chars(message.get("content"))
    note = (
        f"[output pruned to save context: {size:,} characters. "
        "Call the tool again if you still need it.]"
    )
    return {**message, "content": note}


def _pruned_images(message: Message) -> Message:
    note = (
        f"[{image_count(message)} image(s) of the tool results above pruned to save context. "
        "Call the tool again if you still need them.]"
    )
    return {"role": "user", "content": note}


def _dropped_note(count: int) -> Message:
    return {
        "role": "user",
        "content": (
            f"[Context compacted: {count} earlier messages (tool calls and their results) were "
            "removed to fit the context window. The goal above still applies; call a tool "
            "again if you need an old result.]"
        ),
    }


class _Work:
    """Mutable scratch state of one compaction, with a running token total."""

    def __init__(self, head: list[Message], groups: list[list[Message]], extra: int) -> None:
        self.head = head
        self.groups = groups
        self.extra = extra
        self.dropped = 0
        self.pruned = 0
        self.shortened = 0
        self.total = extra + sum(message_tokens(m) for m in head)
        self.total += sum(message_tokens(m) for group in groups for m in group)

    def replace(self, group: list[Message], index: int, message: Message) -> None:
        self.total += message_tokens(message) - message_tokens(group[index])
        group[index] = message

    def drop_oldest(self) -> None:
        group = self.groups.pop(0)
        self.total -= sum(message_tokens(m) for m in group)
        self.dropped += len(group)

    def messages(self) -> list[Message]:
        note = [_dropped_note(self.dropped)] if self.dropped else []
        return [*self.head, *note, *(m for group in self.groups for m in group)]

    def tokens(self) -> int:
        note = message_tokens(_dropped_note(self.dropped)) if self.dropped else 0
        return self.total + note


def _prune_old_outputs(work: _Work, budget: int, keep_recent: int) -> None:
    for group in work.groups[: max(len(work.groups) - keep_recent, 0)]:
        for index, message in enumerate(group):
            if work.tokens() <= budget:
                return
            if message.get("role") == "tool" and _chars(message.get("content")) > PRUNE_MIN_CHARS:
                work.replace(group, index, _pruned(message))
                work.pruned += 1
            elif is_images_message(message):
                work.replace(group, index, _pruned_images(message))
                work.pruned += 1


def _drop_old_groups(work: _Work, budget: int, keep_recent: int) -> None:
    before = (list(work.groups), work.total, work.dropped, work.tokens())
    while work.tokens() > budget and len(work.groups) > keep_recent:
        work.drop_oldest()
    if work.tokens() >= before[3]:
        # The note costs more than the few small messages it replaced: keep them instead.
        work.groups, work.total, work.dropped = before[0], before[1], before[2]


def _shorten_outputs(work: _Work, budget: int) -> None:
    slots = [
        (group, index)
        for group in work.groups
        for index, message in enumerate(group)
        if message.get("role") == "tool" and isinstance(message.get("content"), str)
    ]
    if not slots or work.tokens() <= budget:
        return
    tool_tokens = sum(message_tokens(group[index]) for group, index in slots)
    # What the tool messages may use: the budget minus everything else, minus their overhead
    # (and one token each for rounding), shared equally, minus room for the truncation note.
    room = budget - (work.tokens() - tool_tokens) - len(slots) * (MESSAGE_OVERHEAD_TOKENS + 1)
    share = max(room * CHARS_PER_TOKEN // len(slots) - NOTE_ALLOWANCE_CHARS, MIN_SHORTENED_CHARS)
    for group, index in slots:
        content = group[index]["content"]
        shortened = truncate_output(content, share).text
        if len(shortened) < len(content):
            work.replace(group, index, {**group[index], "content": shortened})
            work.shortened += 1


def compact(
    messages: list[Message],
    budget_tokens: int,
    *,
    head: int = 2,
    extra_tokens: int = 0,
    keep_recent: int = KEEP_RECENT_GROUPS,
) -> Compaction:
    """Fit ``messages`` (plus ``extra_tokens`` of tool schemas) into ``budget_tokens``.

    The first ``head`` messages (system prompt, goal) are always kept as they are. The result
    may still exceed the budget when the head and the last group alone do not fit; the model
    call then decides (and a context-overflow error forces a harder pass).
    """
    work = _Work(
        list(messages[:head]), [list(g) for g in group_messages(messages[head:])], extra_tokens
    )
    before = work.tokens()
    if before > budget_tokens:
        _prune_old_outputs(work, budget_tokens, keep_recent)
        _drop_old_groups(work, budget_tokens, keep_recent)
        _shorten_outputs(work, budget_tokens)
    return Compaction(
        messages=work.messages(),
        tokens_before=before,
        tokens_after=work.tokens(),
        pruned_outputs=work.pruned,
        dropped_messages=work.dropped,
        shortened_outputs=work.shortened,
    )


# --- judging a provider's context overflow ----------------------------------------------------

#: A request estimated at no more than this share of the context window is clearly well within
#: it: the estimate (4 characters a token) is rough, but not off by a factor of four.
WELL_WITHIN_SHARE = 0.25

_NUMBER = r"(\d{1,3}(?:,\d{3})+|\d+)"
_LIMIT_PATTERNS = (
    re.compile(
        r"(?:maximum context length|context (?:length|window|size)|max(?:imum)? "
        r"(?:input |prompt )?tokens?|token limit|limit)(?: of| is|:|=)?\s*" + _NUMBER,
        re.IGNORECASE,
    ),
    re.compile(_NUMBER + r"\s*tokens?\s*(?:maximum|max|limit)", re.IGNORECASE),
    re.compile(r">\s*" + _NUMBER, re.IGNORECASE),
)
_REQUESTED_PATTERNS = (
    re.compile(
        r"(?:requested|you sent|resulted in|got|"
        r"prompt (?:has|contains|is)|input (?:has|contains|is))"
        r"(?: about)?\s*" + _NUMBER + r"\s*tokens",
        re.IGNORECASE,
    ),
    re.compile(_NUMBER + r"\s*tokens?\s*>", re.IGNORECASE),
)


@dataclass(frozen=True)
class OverflowClaim:
    """What a provider's context-overflow answer says in numbers, when it says them."""

    limit: int | None = None
    requested: int | None = None


def _first_number(text: str, patterns: tuple[re.Pattern[str], ...]) -> int | None:
    for pattern in patterns:
        found = pattern.search(text)
        if found:
            return int(found.group(1).replace(",", ""))
    return None


def overflow_claim(text: str) -> OverflowClaim:
    """The context limit and the requested tokens an overflow message states (either may be
    missing): ``maximum context length is 8192 tokens ... you requested 9000 tokens``,
    ``prompt is too long: 210000 tokens > 200000 maximum``."""
    return OverflowClaim(
        limit=_first_number(text, _LIMIT_PATTERNS),
        requested=_first_number(text, _REQUESTED_PATTERNS),
    )


@dataclass(frozen=True)
class OverflowVerdict:
    """Whether a provider's context overflow can be true of the request (``real``), and why,
    in words fit for a run's reason."""

    real: bool
    why: str
    estimate: int
    window: int
    claim: OverflowClaim

    def data(self) -> dict[str, Any]:
        return {
            "overflow": "real" if self.real else "misreported",
            "estimated_tokens": self.estimate,
            "context_window": self.window,
            "claimed_limit": self.claim.limit,
            "claimed_tokens": self.claim.requested,
            "why": self.why,
        }


def judge_overflow(text: str, estimate: int, window: int) -> OverflowVerdict:
    """Weigh a provider's context-overflow answer (``text``) against the request's estimated
    size and the endpoint's configured context ``window``.

    The provider's own stated limit, when it gives one, is the window judged against (the
    configured one may be wrong). The answer is *misreported* when its numbers contradict
    themselves (the tokens it says were requested fit the limit it states) or when the request
    is clearly well within the window (at most :data:`WELL_WITHIN_SHARE` of it); otherwise it is
    *real*."""
    claim = overflow_claim(text)
    limit = claim.limit or window
    source = "the limit the provider states" if claim.limit else "the endpoint's context window"
    share = estimate / limit if limit > 0 else float("inf")
    if claim.limit and claim.requested is not None and claim.requested <= claim.limit:
        why = (
            f"the provider says {claim.requested:,} tokens were requested, within its own "
            f"limit of {claim.limit:,}"
        )
        return OverflowVerdict(False, why, estimate, limit, claim)
    if share <= WELL_WITHIN_SHARE:
        why = (
            f"the request is about {estimate:,} tokens, {share:.1%} of {source} ({limit:,} tokens)"
        )
        return OverflowVerdict(False, why, estimate, limit, claim)
    why = f"the request is about {estimate:,} tokens, {share:.0%} of {source} ({limit:,} tokens)"
    return OverflowVerdict(True, why, estimate, limit, claim)

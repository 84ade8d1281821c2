"""A conversation checkpoint: an invocation's settled history folded once, so a resume reads
and folds only the steps after it (pure).

A resume rebuilds the conversation from the journal (``runtime.history``): reading and folding
every step costs a long invocation time in proportion to its history. When an invocation parks
(a gated call), the loop folds the *persisted* steps before the last entry into a checkpoint and
the journal stores it; the next resume starts from it and replays only the steps after
``upto_seq``. Invariants:

* A checkpoint is a function of the journal's prefix ``seq <= upto_seq``, the repetition limits
  and the image endpoint, never of the live conversation (a scrubbing journal persists less
  than the loop saw; a resume must see what a full replay would).
* Settled steps never change, so a checkpoint stays true; it is used only when it ``fits``
  the steps after it (each tool step answers a model step after ``upto_seq``) and the limits
  and endpoint it was folded under; otherwise the resume replays the whole journal.
* It covers only entries a replay folds without planning (``dispatch.replay_settled``), the
  notices and non-final answers: it stops at the first entry that would need the toolset.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

import immutables

from runtime.conversation import Conversation
from runtime.history import (
    Log,
    ModelEntry,
    NoticeEntry,
    files_written_by,
    read_log,
    settled_step,
    smallest_budget,
)
from runtime.invocation import StepJournal, StepRecord
from runtime.model_images import ImageEndpoint
from runtime.repetition import RepetitionLimits, RepetitionState
from runtime.types import Message

logger = logging.getLogger(__name__)
#: Below this many entries before the last a checkpoint saves less than it costs to write.
MIN_ENTRIES = 16
VERSION = 1


@dataclass(frozen=True)
class Checkpoint:
    """The conversation as a replay of the steps ``seq <= upto_seq`` leaves it."""

    upto_seq: int
    prompt: list[Message]
    history: list[Message]
    model_steps: int
    repetition: RepetitionState
    corrections: int
    correcting: bool
    #: The smallest context budget the covered model steps used (None: none recorded one).
    budget_tokens: int | None
    files_written: frozenset[str]
    #: What the fold depended on: the repetition limits, and the endpoint when images showed.
    limits: dict[str, int]
    images_for: tuple[bool, str] | None

    def fits(
        self, later: list[StepRecord], limits: RepetitionLimits, endpoint: ImageEndpoint
    ) -> bool:
        """May a resume start here with ``later`` (the steps after ``upto_seq``)?"""
        if self.limits != dataclasses.asdict(limits):
            return False
        if self.images_for is not None and self.images_for != _endpoint_key(endpoint):
            return False
        return all(_after(record, self.upto_seq) for record in later)

    def to_json(self) -> str:
        state = self.repetition
        return json.dumps(
            {
                "v": VERSION,
                "upto_seq": self.upto_seq,
                "prompt": self.prompt,
                "history": self.history,
                "model_steps": self.model_steps,
                "repetition": {
                    "seen": list(state.seen.items()),
                    "last_tool": state.last_tool,
                    "last_step": state.last_step,
                    "streak": state.streak,
                },
                "corrections": self.corrections,
                "correcting": self.correcting,
                "budget_tokens": self.budget_tokens,
                "files_written": sorted(self.files_written),
                "limits": self.limits,
                "images_for": list(self.images_for) if self.images_for else None,
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )


async def resume_steps(
    journal: StepJournal, limits: RepetitionLimits, endpoint: ImageEndpoint
) -> tuple[list[StepRecord], Checkpoint | None]:
    """The steps a resume replays and the checkpoint they follow (None: every step)."""
    state, records = await journal.resume_point()
    checkpoint = from_json(state) if state is not None else None
    if checkpoint is not None and not checkpoint.fits(records, limits, endpoint):
        checkpoint = None
    if state is not None and checkpoint is None:  # not one to start from: every step
        records = await journal.steps()
    return records, checkpoint


async def keep_checkpoint(
    journal: StepJournal, limits: RepetitionLimits, endpoint: ImageEndpoint
) -> None:
    """A parked invocation's settled history, folded once from its persisted steps and kept
    for the next resume; best effort (a resume without it replays every step)."""
    try:
        key_for = journal.idempotency_key
        found = checkpoint_of(await journal.steps(), key_for, limits=limits, endpoint=endpoint)
        if found is not None:
            await journal.save_checkpoint(found.upto_seq, found.to_json())
    except Exception:
        logger.warning("the conversation checkpoint was not kept", exc_info=True)


def from_json(text: str) -> Checkpoint | None:
    """The checkpoint ``text`` holds; None when it is not one this version wrote."""
    try:
        data = json.loads(text)
        if data.get("v") != VERSION:
            return None
        rep = data["repetition"]
        images_for = data["images_for"]
        return Checkpoint(
            upto_seq=int(data["upto_seq"]),
            prompt=list(data["prompt"]),
            history=list(data["history"]),
            model_steps=int(data["model_steps"]),
            repetition=RepetitionState(
                seen=immutables.Map((str(k), int(v)) for k, v in rep["seen"]),
                last_tool=str(rep["last_tool"]),
                last_step=int(rep["last_step"]),
                streak=int(rep["streak"]),
            ),
            corrections=int(data["corrections"]),
            correcting=bool(data["correcting"]),
            budget_tokens=data["budget_tokens"],
            files_written=frozenset(data["files_written"]),
            limits=dict(data["limits"]),
            images_for=(bool(images_for[0]), str(images_for[1])) if images_for else None,
        )
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None


def checkpoint_of(
    steps: list[StepRecord],
    key_for: Callable[[int, int], str],
    *,
    limits: RepetitionLimits,
    endpoint: ImageEndpoint,
    min_entries: int = MIN_ENTRIES,
) -> Checkpoint | None:
    """The checkpoint of a parked invocation's persisted ``steps``: every entry before the last
    that a replay folds without planning; None when that is fewer than ``min_entries`` or the
    journal does not split cleanly there."""
    log = read_log(steps, key_for)
    prompt = log.prompt
    if prompt is None:
        return None
    fold = _Fold(log, prompt, limits, endpoint)
    covered = 0
    for entry in log.entries[:-1]:
        if not fold.add(entry):
            break
        covered += 1
    if covered < min_entries:
        return None
    upto = log.entries[covered].seq - 1
    if not all(_after(record, upto) for record in steps if record.seq > upto):
        return None
    files = {name for record in steps if record.seq <= upto for name in files_written_by(record)}
    folded = fold.conversation
    return Checkpoint(
        upto_seq=upto,
        prompt=list(prompt),
        history=folded.history,
        model_steps=folded.model_steps,
        repetition=folded.repetition,
        corrections=folded.corrections,
        correcting=folded.correcting,
        budget_tokens=smallest_budget([e for e in log.model_entries if e.seq <= upto]),
        files_written=frozenset(files),
        limits=dataclasses.asdict(limits),
        images_for=_endpoint_key(endpoint) if fold.images else None,
    )


class _Fold:
    """What ``loop._Stepper.apply`` does to a conversation for the entries it folds without
    planning (a notice, an answer that is not the last entry, a settled step whose calls all
    ran); :meth:`add` returns False, folding nothing, for any other entry."""

    def __init__(
        self,
        log: Log,
        prompt: list[Message],
        limits: RepetitionLimits,
        endpoint: ImageEndpoint,
    ) -> None:
        self.log, self.limits, self.endpoint = log, limits, endpoint
        # The budget is not folded here (``smallest_budget`` of the covered steps is).
        self.conversation = Conversation(prompt=prompt, budget_tokens=0)
        self.images = False

    def add(self, entry: ModelEntry | NoticeEntry) -> bool:
        conversation = self.conversation
        if isinstance(entry, NoticeEntry):
            conversation.add_notice(entry.name, entry.message)
            return True
        if entry.client_calls:
            return False
        settled = None
        if entry.calls:
            validated = self.log.validated(entry)
            state = conversation.repetition
            settled = settled_step(self.log, entry, validated, state, self.limits, self.endpoint)
            if settled is None:
                return False
        conversation.add_model_message(entry.message)
        if settled is not None:
            self.images = self.images or settled.images
            conversation.repetition = settled.state
            conversation.history += settled.messages
        return True


def _after(record: StepRecord, upto: int) -> bool:
    """``record`` lies after ``upto`` and, a tool step, answers a model step after it."""
    if record.seq <= upto:
        return False
    if record.kind != "tool":
        return True
    model_seq = record.request.get("model_seq") if isinstance(record.request, dict) else None
    return isinstance(model_seq, int) and model_seq > upto


def _endpoint_key(endpoint: ImageEndpoint) -> tuple[bool, str]:
    return bool(endpoint.vision), str(endpoint.endpoint_name)
